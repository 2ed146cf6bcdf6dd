#!/usr/bin/env python
"""Randomized differential fuzzer for linred's segmented reductions (GPU first, CPU smoke mode).

Every case draws, from ``numpy.random.default_rng([seed, index])``, a function, an array kind,
a dtype, a shape / axis / memory layout, a segment specification and length distribution, the
call's options (backend, check, stream, dtype=, out=, ddof, remainder) and a set of routing and
tiling knobs of linred's modules (monkeypatched for that case only, then restored), runs the
call and compares it with an independent float64 NumPy reference (vectorized over segments with
``ufunc.reduceat``; the documented empty-segment, NaN/inf, tie and ddof rules).  For PyTorch
float32/float64 tensors of differentiable functions it also checks ``x.grad`` of
``sum(result * w)`` against a float64 reference derivative.

Usage (from the repository root, linred importable):

    # the GPU host (16 cores: NVRTC compiles in parallel), within a 150 s budget:
    timeout 150 python tools/fuzz_gpu.py --workers 8 --seconds 110 --grace 20 --seed 1 --out $OUT/fuzz.jsonl \
        --scratch /tmp/fuzz
    python tools/fuzz_gpu.py --seconds 140 --seed 1 --out fuzz.jsonl            # one process
    python tools/fuzz_gpu.py --cpu --seconds 60 --out /tmp/fz.jsonl             # host arrays only
    python tools/fuzz_gpu.py --replay 1000:123 [--cpu]                          # one case, verbose
    python tools/fuzz_gpu.py --seed 1000 --stop 124 --seconds 1e9               # cases 0..123 again, in order

Worker ``i`` of ``--workers N`` runs seed ``SEED * 1000 + i`` and writes ``OUT.w<i>`` (failures),
``OUT.w<i>.summary.json`` and, while a case runs, ``OUT.w<i>.current``; the parent merges them
into ``OUT`` and ``OUT.summary.json`` and prints the summary (cases per function, spec, kind and
dtype, length distribution, backend, layout, knob; refusals by message; the largest error /
tolerance per function and result dtype among passing cases; each failure with its --replay).

Exit status: 0 no failures, 1 failures, 3 a fatal CUDA error stopped a worker, 4 a hang.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import traceback
import warnings

import numpy as np

# (host reductions of NaN and infinities warn as NumPy does: expected here)
warnings.filterwarnings("ignore", category=RuntimeWarning)

FUNCS = ("sum", "mean", "max", "min", "prod", "argmax", "argmin", "logsumexp", "softmax", "log_softmax", "var", "std")
PER_ELEMENT = ("softmax", "log_softmax")
FUSED = ("logsumexp", "softmax", "log_softmax", "var", "std")
ARG = ("argmax", "argmin")
DIFFERENTIABLE = ("sum", "mean", "max", "min", "prod", "var", "std", "logsumexp", "softmax", "log_softmax")
FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("int32", "int64")
FEATURES = (1, 2, 3, 4, 8, 16, 17, 32, 33, 64, 128)
TILES = (32, 64, 128, 256, 1024, 2048, 32768)
#: special-value cases also put one at a batch slice's first row (off: --no-first-row-special)
FIRST_ROW_SPECIAL = True

FATAL = re.compile(
    r"illegal memory access|illegal address|misaligned address|unspecified launch failure|an illegal instruction|"
    r"device-side assert|CUDA_ERROR_(ILLEGAL_ADDRESS|ILLEGAL_INSTRUCTION|LAUNCH_FAILED|MISALIGNED_ADDRESS|"
    r"HARDWARE_STACK_ERROR|ASSERT|LAUNCH_TIMEOUT|UNKNOWN)|cudaError(IllegalAddress|IllegalInstruction|LaunchFailure|"
    r"MisalignedAddress|Assert|LaunchTimeout|Unknown)|CUBLAS_STATUS_EXECUTION_FAILED",
    re.I,
)
REFUSAL = re.compile(
    r"not supported|does not support|unsupported|refus|cannot|can't|has no |have no |no order|not available|"
    r"needs |only |must be None|serves? |is not usable|not implemented",
    re.I,
)


# ----------------------------------------------------------------------------------------------
# The reference (float64 NumPy, independent of linred)
# ----------------------------------------------------------------------------------------------


def seg_reduce(ufunc, a3, off, identity, dtype=None):
    """``ufunc`` over each segment ``[off[s], off[s+1])`` of axis 1 of ``a3`` (B, n, D); empty
    segments get ``identity``."""
    B, _, D = a3.shape
    m = len(off) - 1
    out = np.full((B, m, D), identity, dtype=dtype or a3.dtype)
    lens = np.diff(off)
    ne = np.nonzero(lens > 0)[0]
    if len(ne):
        # (nonempty segments tile [off[ne[0]], n) once the empty ones, of no width, are left out)
        with np.errstate(all="ignore"):
            out[:, ne, :] = ufunc.reduceat(a3, off[ne], axis=1)
    return out


def spread(v, lens):
    return np.repeat(v, lens, axis=1)


def reference(func, a3, off, ddof, in_dtype):
    """``func`` of ``a3`` (B, n, D; float64, or int64 for integer data) in the segments ``off``:
    (result, aux) with aux holding per-element scales for the tolerances."""
    B, n, D = a3.shape
    lens = np.diff(off).astype(np.int64)
    L3 = lens[None, :, None].astype(np.float64)
    aux = {}
    integer = a3.dtype.kind in "iu"
    with np.errstate(all="ignore"):
        if func in ("sum", "mean"):
            if integer and func == "sum":
                return seg_reduce(np.add, a3, off, 0), {"exact": True}
            af = a3.astype(np.float64)
            s = seg_reduce(np.add, af, off, 0.0)
            S = seg_reduce(np.add, np.abs(af), off, 0.0)
            if func == "mean":
                return s / L3, {"scale": S / np.maximum(L3, 1)}
            return s, {"scale": S}
        if func in ("max", "min"):
            uf = np.maximum if func == "max" else np.minimum
            if integer:
                info = np.iinfo(np.dtype(in_dtype))
                return seg_reduce(uf, a3, off, info.min if func == "max" else info.max), {"exact": True}
            return seg_reduce(uf, a3, off, -np.inf if func == "max" else np.inf), {"exact": True}
        if func == "prod":
            if integer:
                return seg_reduce(np.multiply, a3.astype(np.int64), off, 1), {"exact": True}
            return seg_reduce(np.multiply, a3, off, 1.0), {"prod": True, "lens": np.broadcast_to(L3, (B, len(lens), D))}
        if func in ARG:
            uf = np.maximum if func == "argmax" else np.minimum
            ident = (
                (np.iinfo(np.dtype(in_dtype)).min if func == "argmax" else np.iinfo(np.dtype(in_dtype)).max)
                if integer
                else (-np.inf if func == "argmax" else np.inf)
            )
            e = seg_reduce(uf, a3, off, ident)
            E = spread(e, lens)
            hit = a3 == E
            if not integer:
                hit |= np.isnan(a3) & np.isnan(E)
            pos = np.where(hit, np.arange(n, dtype=np.int64)[None, :, None], n)
            return seg_reduce(np.minimum, pos, off, n, dtype=np.int64), {"exact": True}
        af = a3.astype(np.float64)
        mx = seg_reduce(np.maximum, af, off, -np.inf)
        if func == "logsumexp":
            shift = np.where(np.isfinite(mx), mx, 0.0)
            s = seg_reduce(np.add, np.exp(af - spread(shift, lens)), off, 0.0)
            r = np.log(s) + shift
            return r, {"scale": np.abs(r) + np.abs(shift) + 1.0, "shift": shift}
        if func in PER_ELEMENT:
            shift = np.where(mx != -np.inf, mx, 0.0)  # (NaN stays NaN)
            Sh = spread(shift, lens)
            d = af - Sh
            s = seg_reduce(np.add, np.exp(d), off, 0.0)
            if func == "softmax":
                y = np.exp(d) / spread(s, lens)
                scale = np.where(y == 0, 0.0, np.abs(y) * (1.0 + np.abs(d)))  # (0 * inf: no NaN scale)
                return y, {"scale": scale, "shift": Sh}
            y = d - spread(np.log(s), lens)
            return y, {"scale": np.abs(af) + np.abs(Sh) + np.abs(y) + 1.0, "shift": Sh}
        if func in ("var", "std"):
            s = seg_reduce(np.add, af, off, 0.0)
            mean = s / L3
            dev = af - spread(mean, lens)
            ss = seg_reduce(np.add, dev * dev, off, 0.0)
            sq = seg_reduce(np.add, af * af, off, 0.0)
            free = L3 - ddof
            keep = free > 0
            var = np.where(keep, ss / np.where(keep, free, 1.0), np.nan)
            # (an infinity or a NaN: NaN, as documented; the formula already gives it)
            bad = seg_reduce(np.add, (~np.isfinite(af)).astype(np.int64), off, 0) > 0
            var = np.where(bad, np.nan, var)
            scale = np.where(keep, sq / np.where(keep, free, 1.0), 0.0)
            aux = {"scale": scale, "mean": mean, "var": var}
            if func == "var":
                return var, aux
            return np.sqrt(var), {**aux, "std": True}
    raise ValueError(func)


def reference_grad(func, a3, off, g, ref, aux, ddof):
    """d sum(result * g) / d x in float64 (a3 finite float64; ``ref`` the reference result)."""
    _B, n, _D = a3.shape
    lens = np.diff(off).astype(np.int64)
    L3 = lens[None, :, None].astype(np.float64)
    with np.errstate(all="ignore"):
        if func == "sum":
            return spread(g, lens), np.abs(spread(g, lens))
        if func == "mean":
            v = spread(g / np.maximum(L3, 1), lens)
            return v, np.abs(v)
        if func in ("max", "min"):
            pos, _ = reference("argmax" if func == "max" else "argmin", a3, off, 0, "float64")
            dx = np.zeros_like(a3)
            bb, ss, dd = np.nonzero(pos < n)
            dx[bb, pos[bb, ss, dd], dd] = g[bb, ss, dd]
            return dx, np.abs(dx)
        if func == "prod":
            zero = a3 == 0
            zc = seg_reduce(np.add, zero.astype(np.int64), off, 0)
            nzp = seg_reduce(np.multiply, np.where(zero, 1.0, a3), off, 1.0)
            P, ZC, NZP, G = spread(ref, lens), spread(zc, lens), spread(nzp, lens), spread(g, lens)
            dx = np.where(ZC == 0, G * P / np.where(zero, 1.0, a3), np.where((ZC == 1) & zero, G * NZP, 0.0))
            Ls = spread(L3 * np.ones_like(g), lens)
            return dx, np.abs(dx) * (Ls + 2)
        if func == "logsumexp":
            R, G = spread(ref, lens), spread(g, lens)
            e = np.exp(a3 - R)
            return e * G, np.abs(e * G) * (1 + np.abs(a3) + np.abs(R))
        if func == "softmax":
            y = ref
            sgy = spread(seg_reduce(np.add, g * y, off, 0.0), lens)
            sagy = spread(seg_reduce(np.add, np.abs(g * y), off, 0.0), lens)
            dx = y * (g - sgy)
            return dx, np.abs(y) * (np.abs(g) + sagy) * (1 + np.abs(aux["shift"] - a3) + np.abs(a3))
        if func == "log_softmax":
            ey = np.exp(ref)
            sg = spread(seg_reduce(np.add, g, off, 0.0), lens)
            sag = spread(seg_reduce(np.add, np.abs(g), off, 0.0), lens)
            dx = g - ey * sg
            return dx, (np.abs(g) + ey * sag) * (1 + np.abs(ref))
        if func in ("var", "std"):
            mean = spread(aux["mean"], lens)
            free = L3 - ddof
            keep = free > 0
            if func == "var":
                scale = np.where(keep, 2 * g / np.where(keep, free, 1.0), 0.0)
            else:
                sd = ref
                keep = keep & (sd != 0)
                scale = np.where(keep, g / np.where(keep, free * sd, 1.0), 0.0)
            S = spread(scale, lens)
            dx = (a3 - mean) * S
            # (the mean's own error is relative to the segment's mean |x|, not to this element's |x|)
            mabs = spread(seg_reduce(np.add, np.abs(a3), off, 0.0) / np.maximum(L3, 1), lens)
            return dx, (np.abs(a3) + np.abs(mean) + 4 * mabs) * np.abs(S) * (4 if func == "std" else 1)
    raise ValueError(func)


# ----------------------------------------------------------------------------------------------
# Case generation
# ----------------------------------------------------------------------------------------------


def pick(rng, items, p=None):
    if p is not None:
        p = np.asarray(p, dtype=float)
        p = p / p.sum()
    return items[int(rng.choice(len(items), p=p))]


def gen_lengths(rng, rows_budget, dist):
    """Segment lengths (a list) of one of the distributions, their sum at most about ``rows_budget``."""
    R = max(1, int(rows_budget))
    cap_m = 200_000
    if dist == "zero":
        return [0] * int(rng.integers(0, 4))
    if dist == "ones":
        return [1] * int(min(R, cap_m, rng.integers(1, R + 1)))
    if dist in ("geom", "empty"):
        mu = float(np.exp(rng.uniform(np.log(4), np.log(5000))))
        mu = min(mu, R)
        m = int(max(1, min(cap_m, R // max(mu, 1))))
        ls = rng.geometric(1.0 / (mu + 1.0), m) - 1
        if dist == "empty":
            ls[rng.random(m) < 0.5] = 0
            ls = np.concatenate([[0] * int(rng.integers(0, 3)), ls, [0] * int(rng.integers(0, 3))])
        ls = list(map(int, ls))
        while sum(ls) > R and len(ls) > 1:
            ls.pop()
        return ls
    if dist == "one_long":
        big = int(min(rng.integers(30_000, 200_001), max(1, 0.9 * R)))
        mu = float(pick(rng, (4, 8, 16, 64)))
        rest = max(0, R - big)
        m = int(max(0, min(cap_m, rest // (mu + 1))))
        ls = list(map(int, rng.geometric(1.0 / (mu + 1.0), m) - 1)) if m else []
        while sum(ls) > rest and ls:
            ls.pop()
        where = pick(rng, ("first", "last", "middle"))
        k = 0 if where == "first" else len(ls) if where == "last" else int(rng.integers(0, len(ls) + 1))
        ls.insert(k, big)
        if rng.random() < 0.2 and R - sum(ls) > 30_000:  # (a second one)
            ls.insert(int(rng.integers(0, len(ls) + 1)), int(min(R - sum(ls), rng.integers(30_000, 60_000))))
        return ls
    if dist == "straddle":
        Ts = [T for T in TILES if T - 1 <= R] or [1]
        ls = []
        total = 0
        for _ in range(int(rng.integers(1, 64))):
            r = rng.random()
            if r < 0.6:
                T = pick(rng, Ts)
                k = int(rng.integers(1, 4))
                v = max(0, k * T + int(rng.integers(-1, 2)))
            elif r < 0.8:
                v = 0
            else:
                v = int(rng.integers(1, 40))
            if total + v > R:
                v = 0 if rng.random() < 0.5 else R - total
            ls.append(int(v))
            total += v
            if total >= R:
                break
        return ls
    if dist == "few":
        m = int(rng.integers(1, 4))
        cuts = np.sort(rng.integers(0, R + 1, m - 1))
        b = np.diff(np.concatenate([[0], cuts, [int(rng.integers(max(1, R // 2), R + 1))]]))
        return list(map(int, np.maximum(b, 0)))
    if dist == "uniform":
        L = int(min(R, pick(rng, (1, 2, 3, 5, 7, 8, 16, 31, 32, 33, 100, 127, 128, 129, 1000, 4096, 5000))))
        return [L] * int(max(1, min(cap_m, R // L)))
    raise ValueError(dist)


def fixed_length(rng, R):
    if rng.random() < 0.6:
        T = pick(rng, [T for T in TILES if max(R, 32) >= T])
        L = max(1, T * int(rng.integers(1, 3)) + int(rng.integers(-1, 2)))
    else:
        L = int(pick(rng, (1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 31, 33, 48, 63, 65, 100, 500, 513, 1000, 3000)))
    return max(1, min(L, max(1, R)))


def make_case(seed, index, cpu, kinds):
    rng = np.random.default_rng([seed, index, 7])
    c = {"seed": seed, "index": index, "cpu": cpu}
    func = pick(rng, FUNCS, [10, 8, 8, 8, 5, 5, 5, 8, 10, 8, 6, 6])
    kind = pick(rng, kinds)
    if kind == "numpy" or kind == "cupy":
        dts = ("float16", "float32", "float64", "int32", "int64")
        p = [1.5, 4, 3, 1, 1]
    else:
        dts = ("float16", "bfloat16", "float32", "float64", "int32", "int64")
        p = [1.5, 1.5, 4, 3, 1, 1]
    dtype = pick(rng, dts, p)
    if dtype in INTS and func not in ("sum", "max", "min", "argmax", "argmin") and rng.random() < 0.7:
        dtype = "float32"
    c.update(func=func, kind=kind, dtype=dtype)
    # shape: batch dims, rows, feature dims
    d = pick(rng, FEATURES, [14, 2, 2, 2, 2, 2, 1, 2, 1, 1, 1])
    r = rng.random()
    batch = [] if r < 0.6 else [int(pick(rng, (2, 3, 5)))] if r < 0.9 else [2, int(pick(rng, (2, 3)))]
    if d == 1:
        feat = [] if rng.random() < 0.85 else [1]
    elif d in (4, 8, 16, 64) and rng.random() < 0.2:
        feat = {4: [2, 2], 8: [2, 4], 16: [4, 4], 64: [8, 8]}[d]
    else:
        feat = [d]
    B = int(np.prod(batch)) if batch else 1
    cap = 150_000 if cpu else 1_500_000
    budget = int(np.exp(rng.uniform(np.log(64), np.log(cap))))
    # segments
    spec = pick(rng, ("fixed", "offsets", "lengths", "ids_sorted", "ids_unsorted"), [3, 3, 2, 1.2, 1])
    c["spec"] = spec
    dist = None
    if spec != "fixed":
        dist = pick(
            rng,
            ("geom", "empty", "ones", "one_long", "straddle", "few", "uniform", "zero"),
            [5, 2, 1, 2, 3, 1.5, 1, 0.3],
        )
        if dist == "one_long" or (dist == "straddle" and rng.random() < 0.5):
            budget = cap  # (room for the long segments)
    R = max(1, budget // (B * d))
    remainder = None
    if spec == "fixed":
        L = fixed_length(rng, R)
        if rng.random() < 0.03:
            m, extra = 0, 0
        else:
            m = int(max(1, min(200_000, R // L)))
            extra = 0
            if L > 1 and rng.random() < 0.3:
                remainder = pick(rng, ("drop", "keep"))
                extra = int(rng.integers(1, L))
        n = m * L + extra
        lengths = [L] * m + ([extra] if remainder == "keep" else [])
        c.update(L=L, remainder=remainder, dist="fixed")
    else:
        lengths = gen_lengths(rng, R, dist)
        n = int(sum(lengths))
        c["dist"] = dist
    c["n"] = n
    c["m"] = len(lengths)
    shape = [*batch, n, *feat]
    axis = len(batch)
    if rng.random() < 0.3:
        axis = axis - len(shape)
    c.update(shape=shape, axis=axis)
    c["layout"] = pick(rng, ("contig", "transposed", "strided", "misaligned"), [7, 1, 1, 1.5])
    if c["layout"] == "transposed" and len(shape) < 2:
        c["layout"] = "strided"
    c["offsets_dtype"] = pick(rng, ("int32", "int64"))
    c["container"] = pick(rng, ("same", "numpy", "list"), [6, 2, 1])
    if spec.startswith("ids"):
        c["num_segments"] = "given" if (not lengths or lengths[-1] == 0 or rng.random() < 0.5) else "omitted"
        c["ids_sorted_arg"] = (
            (None if rng.random() < 0.5 else True) if spec == "ids_sorted" else pick(rng, (None, False))
        )
    # options
    c["check"] = bool(rng.random() < 0.8)
    floating = dtype in FLOATS
    c["grad"] = bool(
        kind == "torch" and dtype in ("float32", "float64") and func in DIFFERENTIABLE and rng.random() < 0.35
    )
    if cpu:
        c["backend"] = pick(rng, ("auto", "numpy"), [8, 2])
    else:
        c["backend"] = pick(rng, ("auto", "nvrtc", "cub", "cublas", "nvmath"), [13, 4, 2, 1, 1])
    c["stream"] = None
    if not cpu and rng.random() < 0.25 and not (c["grad"] and rng.random() < 0.9):
        c["stream"] = pick(rng, ("arg", "arg_int", "current"))
    dtype_arg = None
    if rng.random() < 0.15 and func not in ARG:
        if func in FUSED:
            choices = {
                "float64": ("float32",),
                "float32": ("float64",),
                "float16": ("float32",),
                "bfloat16": ("float32",),
                "int32": ("float32", "float64"),
                "int64": ("float64",),
            }[dtype]
        elif func in ("sum", "mean", "prod"):
            choices = {
                "float64": ("float64",),
                "float32": ("float64",),
                "float16": ("float32", "float64"),
                "bfloat16": ("float32",),
                "int32": ("int64", "float64"),
                "int64": ("int64",),
            }[dtype]
            if func == "mean" and dtype in INTS:
                choices = ("float64", "float32")
        else:
            choices = (dtype,)
        dtype_arg = pick(rng, choices)
    c["dtype_arg"] = dtype_arg
    c["out"] = bool(func in ("sum", "mean", "max", "min", "prod") and not c["grad"] and rng.random() < 0.15)
    c["ddof"] = pick(rng, (0, 0, 1, 2, 0.5)) if func in ("var", "std") else 0
    c["special"] = bool(floating and not c["grad"] and rng.random() < 0.15)
    c["ties"] = bool(func in ("max", "min", "argmax", "argmin") and floating and rng.random() < 0.3)
    c["scale"] = (
        float(pick(rng, (1.0, 1.0, 1e-3, 10.0, 1e3)))
        if dtype not in ("float16", "bfloat16")
        else float(pick(rng, (1.0, 4.0)))
    )
    c["offset"] = float(pick(rng, (0.0, 0.0, 0.5, 3.0))) * (
        1.0 if func not in ("sum", "mean") or dtype not in ("float16",) else 0.0
    )
    knobs = draw_knobs(rng, cpu)
    if not cpu and func in FUSED and rng.random() < 0.5:
        # (the one-kernel paths for small calls too, and very long segments listed for the block kernel)
        knobs["linred._softmax_kernel:MIN_WORKERS_PER_SM"] = 0
        if lengths and max(lengths) > 1 << 15 and rng.random() < 0.6:
            knobs["linred._softmax_kernel:LONG_MIN_VALUES"] = 0
    c["knobs"] = knobs
    return c, lengths, rng


# ----------------------------------------------------------------------------------------------
# Knobs: module constants and backend options patched for one case
# ----------------------------------------------------------------------------------------------

GPU_KNOBS = [
    ("linred._softmax_kernel", "MIN_WORKERS_PER_SM", (16, 0, 0, 1, 4, 1000)),
    ("linred._softmax_kernel", "FEW_WORKERS_LANE_VALUES", (512, 1, 1 << 40)),
    ("linred._softmax_kernel", "MAX_MEAN_ROWS", (1 << 14, 16, 256, 1 << 16)),
    ("linred._softmax_kernel", "GROUP", (None, 1, 2, 4, 8, 16, 32)),
    ("linred._softmax_kernel", "PAIRS", (True, False)),
    ("linred._softmax_kernel", "PAIRS_MIN_ROWS", (4096, 0, 64)),
    ("linred._softmax_kernel", "LSE_RUNS", (True, False)),
    ("linred._softmax_kernel", "LSE_RUNS_MIN_MEAN", (2048, 0, 16, 256)),
    ("linred._softmax_kernel", "LSE_RUNS_MIN_MEAN_16BIT", (16384, 0, 64)),
    ("linred._softmax_kernel", "SOFTMAX_RUNS_MIN_MEAN", (8192, 0, 32)),
    ("linred._softmax_kernel", "RUNS_MIN_VALUES", (1 << 25, 0, 4096)),
    ("linred._softmax_kernel", "WHOLE_WARP_SHARE", (0.75, 0.0, 1e9)),
    ("linred._softmax_kernel", "LANES", ("default", {}, "all:1,2", "all:64,4", "all:4,8")),
    ("linred._softmax_kernel", "BACKWARD_LANE_VALUES", (8, 1, 64)),
    ("linred._softmax_kernel", "BLOCKS_PER_SM", (64, 1, 2)),
    ("linred._softmax_kernel", "LONG_MIN_VALUES", (1 << 26, 0, 0, 100_000)),
    ("linred._softmax_kernel", "LONG_LIST", (1024, 1, 2, 3)),
    ("linred._softmax_kernel", "LONG_ROWS", (1 << 15, 0, 1000)),  # (checked calls: list where n > it)
    ("linred._softmax_kernel", "GRAD_PARTS_MIN_MEAN", ("default", "all:1", "all:64", "all:1099511627776")),
    ("linred._pieces", "ENABLED", (True, False)),
    ("linred._pieces", "LANE_VALUES", (128, 1, 8, 4096)),
    ("linred._pieces", "SHORTEST", (32, 1, 4)),
    ("linred._pieces", "WORKERS_PER_SM", (64, 1, 1000)),
    ("linred._pieces", "LONG_LANE_VALUES", (1024, 0, 0, 16)),  # (0: every var and std call of rows past a piece)
    ("linred._pieces", "BLOCK_JOIN_PIECES", (256, 0, 1 << 40)),
    ("linred._arg_kernel", "ARG_ROWS", (128, 1, 3, 8, 32, 64, 512)),
    ("linred._arg_kernel", "ARG_LOADS", (8, 1, 2, 3, 16)),
    ("linred._arg_kernel", "BLOCKS_PER_SM", (32, 1)),
    ("linred.backends.nvrtc.executors", "FUSED_FIXUP_PASSES", (2, 0, 1 << 40)),
    ("linred.backends.nvrtc.kernels", "FEATURE_TILE_ROWS", (128, 16, 32, 64)),  # (+ executors' copy)
    ("linred.backends.nvrtc.kernels", "FEATURE_FEW_ROWS", (1024, 0, 200)),
    ("linred.backends.nvrtc.kernels", "FEATURE_LONG_CHUNK", (64, 1, 2, 5)),
    ("linred.backends.nvrtc.kernels", "FEATURE_CHUNKS_MIN_ROWS", (32768, 0, 500)),
    ("linred.backends.nvrtc.kernels", "FEATURE_NARROW_GROUPS", (4, 0, 1000)),
    ("linred.backends.nvrtc.kernels", "FEATURE_ROWS_PER_LANE", (8, 1, 2)),
    ("linred.backends.nvrtc.kernels", "FEATURE_LANE_ROWS", (12, 1, 3)),
    ("special", "SMS", (None, 1, 2)),  # multiprocessors() as _softmax_kernel and _arg_kernel see it
    ("special", "ONE_SM_LAUNCHER", (False, True)),  # nvrtc executors' _Launcher.sms = 1
    ("nvrtc", "threads", (256, 128)),
    ("nvrtc", "tile", (4096, 2048, 1024, 512)),
    ("nvrtc", "unroll", (8, 1, 2, 4, 16)),
    ("nvrtc", "unroll_2byte", (4, 1, 2, 8)),
    ("nvrtc", "max_rows", (16, 1, 2, 4)),
    ("nvrtc", "long_threads", (256, 64, 128, 512)),
    ("nvrtc", "long_min_bytes", (2000, 16, 64, 1 << 30)),
    ("nvrtc", "max_tiles_per_block", (16, 1, 2)),
    ("nvrtc", "max_tiles_per_warp", (16, 1, 2)),
    ("nvrtc", "warp_runs_per_sm", (16, 1, 128)),
    ("nvrtc", "tile_runs_per_sm", (20, 1, 128)),
    ("nvrtc", "feature_long_min_bytes", (32 << 20, 1)),
    ("nvrtc", "feature_long_factor", (2, 1, 8)),
    ("nvrtc", "feature_narrow_unroll", (4, 1, 2, 8)),
    ("cub", "path", (None, "cccl", "cupy-cub", "cupy-reduce", "strided-kernel")),
]

CPU_KNOBS = [
    ("linred.backends.numpy", "BLOCK_ELEMENTS", (1 << 18, 1024, 4096)),
    ("linred.backends.numpy", "THREAD_ELEMENTS", (1 << 20, 1024, 8192)),
    ("linred.backends.numpy", "BLAS_BLOCK", (128, 16, 32)),
    ("linred.backends.numpy", "BLAS_BLOCK_FEATURES", (128, 8, 32)),
    ("linred.backends.numpy", "COLUMNS_MIN_LENGTH", (1 << 19, 1024)),
    ("linred.backends.numpy", "IDENTITY_PRODUCT_MAX", (512, 1 << 20)),
    ("linred.backends.numpy", "IDENTITY_PRODUCT_MIN_SEGMENTS", (2048, 1)),
    ("linred.backends.numpy", "CHAIN_LONGEST", (8, 1, 32)),
    ("linred.backends.numpy", "ROWS_LOOP_MIN_ROWS", (16, 1)),
    ("linred.backends.numpy", "ROWS_LOOP_MIN_ELEMENTS", (512, 1)),
    ("linred.backends.numpy", "TILE_ROWS", (128, 8, 16, 32)),
    ("linred.backends.numpy", "TILE_MIN_SEGMENTS", (128, 1)),
    ("linred.backends.numpy", "TILE_MIN_ELEMENTS", (1 << 18, 1)),
    ("linred.backends.numpy", "TILE_COMBINE_STEPS", (32, 1, 2)),
    ("linred.backends.numpy", "TILE_CHUNK_ELEMENTS", (1 << 15, 64)),
    ("linred.backends.numpy", "BLOCKED_MAX_BYTES", (4 << 20, 0, 1 << 40)),
    ("linred.backends.numpy", "EXTREME_LOOP_MIN_BYTES", (1 << 20, 0)),
    ("linred.backends.numpy", "EXTREME_LOOP_MIN_ELEMENTS", (1600, 1)),
    ("linred.backends.numpy", "ROWS_STEPS_MIN_BYTES", (1 << 17, 0)),
    ("linred.backends.numpy", "ROWS_STEPS_MAX_STEPS", (64, 1, 4)),
    ("linred._arg", "HOST_LOOP_MIN_FEATURES", (16, 1)),
    ("linred._arg", "HOST_LOOP_MIN_ELEMENTS", (1024, 1)),
]


def draw_knobs(rng, cpu):
    """{"module:attr": value} of the non-default knobs of a case (none in a quarter of the cases)."""
    table = CPU_KNOBS if cpu else GPU_KNOBS
    if rng.random() < 0.25:
        return {}
    p = float(rng.choice((0.1, 0.25, 0.5)))
    out = {}
    for mod, attr, values in table:
        if rng.random() < p:
            v = values[int(rng.integers(1, len(values)))] if len(values) > 1 else values[0]
            out[f"{mod}:{attr}"] = v
    return out


def _knob_value(attr, v, current):
    if attr == "LANES":
        if v == "default":
            return current
        if isinstance(v, str):
            a, b = (int(t) for t in v.split(":")[1].split(","))
            return {
                k: (a, b)
                for k in (
                    "segmented_softmax",
                    "segmented_log_softmax",
                    "segmented_logsumexp",
                    "segmented_var",
                    "segmented_std",
                )
            }
        return dict(v)
    if attr == "GRAD_PARTS_MIN_MEAN":
        if v == "default":
            return current
        k = int(v.split(":")[1])
        return {name: k for name in current}
    return v


#: knobs whose module attribute or option no longer exists (skipped; listed in the summary)
MISSING_KNOBS = set()


@contextlib.contextmanager
def knobs_applied(knobs):
    """Patch the knobs (and clear linred's plan cache around them: plans keep what they read)."""
    import importlib

    import linred

    if not knobs:
        yield
        return
    undo = []
    options = collections.defaultdict(dict)
    try:
        for key, v in knobs.items():
            mod, attr = key.split(":")
            if mod in ("nvrtc", "cub"):
                options[mod][attr] = v
                continue
            if mod == "special":
                if attr == "SMS" and v is not None:
                    from linred import _arg_kernel, _softmax_kernel

                    for m in (_softmax_kernel, _arg_kernel):
                        undo.append((m, "multiprocessors", m.multiprocessors))
                        m.multiprocessors = (lambda sms: lambda device: sms)(v)
                elif attr == "ONE_SM_LAUNCHER" and v:
                    from linred.backends.nvrtc import executors

                    base = executors._Launcher

                    class OneSM(base):
                        def __init__(self, problem):
                            super().__init__(problem)
                            self.sms = 1

                    undo.append((executors, "_Launcher", base))
                    executors._Launcher = OneSM
                continue
            module = importlib.import_module(mod)
            if not hasattr(module, attr):  # (the code changed under the fuzzer: the knob is skipped)
                MISSING_KNOBS.add(key)
                continue
            current = getattr(module, attr)
            undo.append((module, attr, current))
            setattr(module, attr, _knob_value(attr, v, current))
            if attr == "FEATURE_TILE_ROWS":
                from linred.backends.nvrtc import executors

                undo.append((executors, attr, executors.FEATURE_TILE_ROWS))
                executors.FEATURE_TILE_ROWS = v
        from linred.backends import configure

        for name, changes in options.items():
            old = configure(name)
            new = {k: v for k, v in changes.items() if hasattr(old, k)}
            MISSING_KNOBS.update(f"{name}:{k}" for k in changes if not hasattr(old, k))
            if name == "nvrtc":
                threads = new.get("threads", old.threads)
                tile = new.get("tile", old.tile)
                if tile % threads:
                    new["tile"] = threads * max(1, tile // threads)
            undo.append(("configure", name, {k: getattr(old, k) for k in new}))
            configure(name, **new)
        linred.clear_plan_cache()
        yield
    finally:
        for module, attr, value in reversed(undo):
            if module == "configure":
                from linred.backends import configure

                configure(attr, **value)
            else:
                setattr(module, attr, value)
        _clear_quietly()


def _clear_quietly():
    import linred

    with contextlib.suppress(Exception):  # (reported by the next case if the device is broken)
        linred.clear_plan_cache()


# ----------------------------------------------------------------------------------------------
# Arrays
# ----------------------------------------------------------------------------------------------


class Kinds:
    def __init__(self, cpu):
        self.cpu = cpu
        self.torch = None
        self.cupy = None
        try:
            import torch

            self.torch = torch
        except Exception:
            pass
        if not cpu:
            try:
                import cupy

                cupy.cuda.runtime.getDeviceCount()
                self.cupy = cupy
            except Exception:
                self.cupy = None

    def available(self):
        if self.cpu:
            return ["numpy"] + (["torch"] if self.torch is not None else [])
        out = []
        if self.torch is not None and self.torch.cuda.is_available():
            out.append("torch")
        if self.cupy is not None:
            out.append("cupy")
        return out

    def tdtype(self, name):
        return getattr(self.torch, name)

    def make(self, kind, dtype, values, layout, requires_grad=False):
        """``values`` (NumPy, logical shape) as an array of ``kind``/``dtype`` in ``layout``."""
        shape = values.shape
        nd = len(shape)
        rev = tuple(range(nd))[::-1]
        if kind == "numpy":
            dt = np.dtype(dtype)
            if layout == "transposed":
                return np.ascontiguousarray(values.transpose(rev)).astype(dt).transpose(rev)
            if layout == "strided":
                buf = np.zeros((*shape[:-1], 2 * shape[-1]), dt)
                buf[..., ::2] = values
                return buf[..., ::2]
            if layout == "misaligned":
                buf = np.zeros(values.size + 1, dt)
                buf[1:] = values.reshape(-1)
                return buf[1:].reshape(shape)
            return np.ascontiguousarray(values.astype(dt))
        if kind == "cupy":
            cp = self.cupy
            dt = np.dtype(dtype)
            if layout == "transposed":
                return cp.ascontiguousarray(cp.asarray(values.transpose(rev)).astype(dt)).transpose(rev)
            if layout == "strided":
                buf = cp.zeros((*shape[:-1], 2 * shape[-1]), dt)
                buf[..., ::2] = cp.asarray(values).astype(dt)
                return buf[..., ::2]
            if layout == "misaligned":
                buf = cp.zeros(values.size + 1, dt)
                buf[1:] = cp.asarray(values.reshape(-1)).astype(dt)
                return buf[1:].reshape(shape)
            return cp.ascontiguousarray(cp.asarray(values).astype(dt))
        torch = self.torch
        dev = "cpu" if self.cpu else "cuda"
        td = self.tdtype(dtype)

        def t(v):
            return torch.from_numpy(np.ascontiguousarray(v)).to(device=dev, dtype=td)

        if layout == "transposed":
            base = t(values.transpose(rev))
            if requires_grad:
                base.requires_grad_(True)
            return base.permute(rev)
        base = t(values)
        if requires_grad:
            base.requires_grad_(True)
        if layout == "strided":
            buf = torch.zeros((*shape[:-1], 2 * shape[-1]), dtype=td, device=dev)
            buf[..., ::2] = base
            return buf[..., ::2]
        if layout == "misaligned":
            buf = torch.zeros(values.size + 1, dtype=td, device=dev)
            buf[1:] = base.reshape(-1)
            return buf[1:].view(shape)
        return base

    def index(self, kind, values, dtype, container):
        """An index array (offsets, lengths, ids) in ``container``."""
        v = np.asarray(values, dtype=np.dtype(dtype))
        if container == "list":
            return v.tolist()
        if container == "numpy" or kind == "numpy":
            return v
        if kind == "cupy":
            return self.cupy.asarray(v)
        return self.torch.from_numpy(v).to("cpu" if self.cpu else "cuda")

    def host(self, a):
        """(float64 or int64 NumPy copy, dtype name) of an array of any kind."""
        if isinstance(a, np.ndarray):
            name = a.dtype.name
            return (a.astype(np.int64) if a.dtype.kind in "iub" else a.astype(np.float64)), name
        if self.torch is not None and isinstance(a, self.torch.Tensor):
            name = str(a.dtype).removeprefix("torch.")
            t = a.detach().to("cpu")
            if t.dtype.is_floating_point:
                return t.double().numpy(), name
            return t.long().numpy(), name
        name = a.dtype.name
        h = self.cupy.asnumpy(a)
        return (h.astype(np.int64) if h.dtype.kind in "iub" else h.astype(np.float64)), name

    def empty(self, kind, shape, dtype):
        if kind == "numpy":
            return np.empty(shape, np.dtype(dtype))
        if kind == "cupy":
            return self.cupy.empty(shape, np.dtype(dtype))
        return self.torch.empty(shape, dtype=self.tdtype(dtype), device="cpu" if self.cpu else "cuda")

    def healthy(self):
        """Whether the device still runs a kernel and synchronizes."""
        try:
            if self.torch is not None and self.torch.cuda.is_available():
                self.torch.cuda.synchronize()
                float(self.torch.ones(4, device="cuda").sum().item())
            if self.cupy is not None:
                self.cupy.cuda.Device().synchronize()
                float(self.cupy.ones(4).sum().get())
            return True
        except Exception:
            return False

    def sync(self):
        if self.cpu:
            return
        if self.torch is not None and self.torch.cuda.is_available():
            self.torch.cuda.synchronize()
        if self.cupy is not None:
            self.cupy.cuda.Device().synchronize()


# ----------------------------------------------------------------------------------------------
# Running one case
# ----------------------------------------------------------------------------------------------


def make_values(c, lengths, rng):
    """The logical data (float64 or int64) of the case, and the segment arrays."""
    shape = tuple(c["shape"])
    dtype, func = c["dtype"], c["func"]
    size = int(np.prod(shape)) if shape else 0
    if dtype in INTS:
        if func == "prod":
            v = rng.integers(-3, 4, size)
        elif c["dtype_arg"] in ("float32",):
            v = rng.integers(-100, 101, size)
        elif dtype == "int64" and rng.random() < 0.5:
            v = rng.integers(-(1 << 40), 1 << 40, size)
        elif dtype == "int32" and func in ("max", "min", "argmax", "argmin") and rng.random() < 0.5:
            v = rng.integers(-(1 << 31), (1 << 31) - 1, size)
        else:
            v = rng.integers(-100, 101, size)
        if c.get("ties") or rng.random() < 0.2:
            v = v % 5
        return v.astype(np.int64).reshape(shape)
    if func == "prod":
        longest = max([1, *list(lengths)])
        sigma = 1.5 / math.sqrt(longest + 1)
        v = np.exp(rng.normal(0, sigma, size)) * np.where(rng.random(size) < 0.5, -1.0, 1.0)
        if rng.random() < 0.3:
            v[rng.random(size) < 0.01] = 0.0
    else:
        v = rng.normal(0, 1, size) * c["scale"] + c["offset"] * c["scale"]
        if c["ties"]:
            v = np.round(v * 2) / 2
    v = v.reshape(shape)
    if c["special"] and size:
        flat = v.reshape(-1)
        k = int(rng.integers(1, 6))
        idx = rng.integers(0, size, k)
        flat[idx] = rng.choice(np.array([np.nan, np.inf, -np.inf]), k)
        # one segment all -inf (the softmax family's rule)
        nonempty = [i for i, L in enumerate(lengths) if L > 0]
        if nonempty and rng.random() < 0.5:
            s = nonempty[int(rng.integers(0, len(nonempty)))]
            lo = int(sum(lengths[:s]))
            hi = lo + lengths[s]
            ax = c["axis"] % len(shape)
            sl = [slice(None)] * len(shape)
            sl[ax] = slice(lo, min(hi, shape[ax]))
            v[tuple(sl)] = -np.inf
        # A batch slice's (or a feature column's) first row: lanes of a library kernel past a
        # segment's end may read it and multiply it by 0 (cuSPARSE's SpMM of several columns did).
        # Its own generator keeps the main one's draws (cases, lengths, the other values) as they
        # were; the values of 40% of the special-value cases change, so a failure recorded before
        # this draw existed replays as it was with --no-first-row-special.
        extra = np.random.default_rng([c["seed"], c["index"], 1])
        if FIRST_ROW_SPECIAL and shape[c["axis"] % len(shape)] and extra.random() < 0.4:
            ax = c["axis"] % len(shape)
            B, D = int(np.prod(shape[:ax])), int(np.prod(shape[ax + 1 :]))
            v3 = v.reshape(B, shape[ax], D)
            special = extra.choice(np.array([np.nan, np.inf, -np.inf]))
            v3[int(extra.integers(0, B)), 0, int(extra.integers(0, D))] = special
    return v


def expected_dtype(func, dtype, dtype_arg):
    floating = dtype in FLOATS
    if func in ARG:
        return "int64"
    if dtype_arg is not None:
        return dtype_arg
    if func in ("sum", "prod"):
        return dtype if floating else "int64"
    if func in ("max", "min"):
        return dtype
    return dtype if floating else "float64"


def compute_dtype(func, dtype, dtype_arg):
    """The dtype the inputs are rounded to before linred computes (for the reference)."""
    if dtype_arg is None or func in ("max", "min") or func in ARG:
        return None
    if dtype in INTS:
        return None if dtype_arg in ("int64", "float64") else dtype_arg
    order = {"float16": 0, "bfloat16": 0, "float32": 1, "float64": 2}
    if order.get(dtype_arg, 2) < order[dtype]:
        return dtype_arg
    return None


RES_RTOL = {"float64": 1e-12, "float32": 1e-6, "float16": 4e-3, "bfloat16": 1.6e-2}
ACC_RTOL = {"float64": 1e-9, "float32": 1e-5}
ATOL = {"float64": 1e-300, "float32": 2e-38, "float16": 1e-7, "bfloat16": 2e-38}
EPS = {"float64": 2.0**-53, "float32": 2.0**-24}


def tolerance(func, ref, aux, rdt, acc):
    if aux.get("exact"):
        return np.zeros_like(ref, dtype=np.float64)
    rr, ar = RES_RTOL.get(rdt, 1e-12), ACC_RTOL[acc]
    if aux.get("prod"):
        return (
            np.abs(ref) * (rr + 4 * (aux["lens"] + 2) * EPS[acc])
            + ATOL.get(rdt, 0) * 4
            + (1e-30 if acc == "float32" else 1e-300)
        )
    tol = rr * np.abs(ref) + ar * aux["scale"] + ATOL.get(rdt, 0)
    if aux.get("std"):
        var = aux["var"]
        tv = ACC_RTOL[acc] * aux["scale"] + rr * np.abs(var)
        with np.errstate(all="ignore"):
            lin = np.where(ref > 0, tv / (2 * np.where(ref > 0, ref, 1)), np.inf)
        tol = np.minimum(np.sqrt(tv), lin) + rr * np.abs(ref) + ATOL.get(rdt, 0)
    return tol


#: the largest error / tolerance of the finite values of the last case (compare() raises it)
LAST_RATIO = [0.0]


def compare(got, ref, tol, rdt):
    """None if ``got`` matches ``ref`` within ``tol`` (NaN where NaN, the same infinities), else a
    description of the worst mismatch."""
    if got.shape != ref.shape:
        return {"why": "shape", "got_shape": list(got.shape), "ref_shape": list(ref.shape)}
    if got.size == 0:
        return None
    if tol is None:
        tol = np.zeros(ref.shape)
    if ref.dtype.kind in "iu" or got.dtype.kind in "iu":
        bad = got != ref
    else:
        rn, gn = np.isnan(ref), np.isnan(got)
        with np.errstate(all="ignore"):
            err = np.abs(got - ref)
            bad = (
                (rn != gn)
                | (~rn & (np.isinf(ref) | np.isinf(got)) & (got != ref))
                | (~rn & np.isfinite(ref) & np.isfinite(got) & ~(err <= tol))
            )
            if rdt in ("float16", "bfloat16", "float32"):  # (overflow of the result dtype)
                big = np.finfo(np.float16 if rdt == "float16" else np.float32).max
                over = np.isfinite(ref) & (np.abs(ref) > 0.99 * big) & np.isinf(got) & (np.sign(got) == np.sign(ref))
                bad &= ~over
            fin = np.isfinite(ref) & np.isfinite(got) & (tol > 0)
            if fin.any():  # (how close the finite values came to their tolerance: near misses)
                LAST_RATIO[0] = max(LAST_RATIO[0], float(np.max(err[fin] / tol[fin])))
    if not bad.any():
        return None
    where = np.argwhere(bad)
    i = tuple(where[0])
    if ref.dtype.kind == "f" and got.dtype.kind == "f":
        with np.errstate(all="ignore"):
            excess = np.where(
                bad, np.nan_to_num(np.abs(got - ref) / np.maximum(tol, 1e-300), nan=np.inf, posinf=np.inf), 0
            )
        j = tuple(np.unravel_index(int(np.argmax(excess)), bad.shape))
    else:
        j = i
    return {
        "why": "values",
        "bad": int(bad.sum()),
        "of": int(bad.size),
        "first": [int(t) for t in i],
        "got": _num(got[i]),
        "ref": _num(ref[i]),
        "tol": _num(tol[i]) if tol is not None else None,
        "worst": [int(t) for t in j],
        "worst_got": _num(got[j]),
        "worst_ref": _num(ref[j]),
        "worst_tol": _num(tol[j]) if tol is not None else None,
    }


def _num(v):
    v = v.item() if hasattr(v, "item") else v
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class Runner:
    def __init__(self, cpu):
        self.cpu = cpu
        self.kinds = Kinds(cpu)
        import linred

        self.linred = linred
        self.BackendError = linred.BackendError

    def stream_obj(self, kind, mode):
        if kind == "torch":
            s = self.kinds.torch.cuda.Stream()
            return s, (s.cuda_stream if mode == "arg_int" else s)
        s = self.kinds.cupy.cuda.Stream(non_blocking=True)
        return s, (s.ptr if mode == "arg_int" else s)

    def run(self, c, lengths, rng, verbose=False):
        """Returns ("ok"|"fail"|"refused", info)."""
        K = self.kinds
        func, kind, dtype = c["func"], c["kind"], c["dtype"]
        values = make_values(c, lengths, rng)
        x = K.make(kind, dtype, values, c["layout"], requires_grad=c["grad"])
        if c["grad"]:
            x.retain_grad()
        host, _ = K.host(x)
        shape = tuple(c["shape"])
        ax = c["axis"] % len(shape)
        n = shape[ax]
        B = int(np.prod(shape[:ax])) if ax else 1
        D = int(np.prod(shape[ax + 1 :])) if ax + 1 < len(shape) else 1
        # segment arguments
        kw = {}
        spec = c["spec"]
        lens = np.asarray(lengths, dtype=np.int64)
        off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        order = None
        if spec == "fixed":
            kw["segment_length"] = c["L"]
            if c["remainder"]:
                kw["remainder"] = c["remainder"]
            if c["remainder"] == "drop":
                off = off[: c["m"] + 1]
        elif spec == "offsets":
            kw["offsets"] = K.index(kind, off, c["offsets_dtype"], c["container"])
        elif spec == "lengths":
            kw["lengths"] = K.index(kind, lens, c["offsets_dtype"], c["container"])
        else:
            ids = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
            if spec == "ids_unsorted":
                ids = ids[rng.permutation(len(ids))]
            order = np.argsort(ids, kind="stable")
            kw["segment_ids"] = K.index(kind, ids, c["offsets_dtype"], c["container"])
            if c["num_segments"] == "given":
                kw["num_segments"] = len(lens)
            if c.get("ids_sorted_arg") is not None:
                kw["ids_sorted"] = c["ids_sorted_arg"]
        kw["axis"] = c["axis"]
        kw["check"] = c["check"]
        if c["backend"] != "auto" or rng.random() < 0.2:
            kw["backend"] = c["backend"]
        if c["dtype_arg"] is not None:
            kw["dtype"] = c["dtype_arg"]
        if func in ("var", "std") and (c["ddof"] or rng.random() < 0.3):
            kw["ddof"] = c["ddof"]
        rdt = expected_dtype(func, dtype, c["dtype_arg"])
        m = len(off) - 1
        per_elem = func in PER_ELEMENT
        rows = off[-1] if per_elem else m
        out_shape = (*shape[:ax], int(rows), *shape[ax + 1 :])
        if c["out"]:
            kw["out"] = out = K.empty(kind, out_shape, rdt)
        f = getattr(self.linred, f"segmented_{func}")
        stream = None
        if c["stream"]:
            stream, handle = self.stream_obj(kind, c["stream"])
            if c["stream"] != "current":
                kw["stream"] = handle
        # run
        K.sync()
        try:
            if c["stream"] == "current":
                ctx = K.torch.cuda.stream(stream) if kind == "torch" else stream
                with ctx:
                    res = f(x, **kw)
            else:
                res = f(x, **kw)
            if stream is not None:
                stream.synchronize()
            K.sync()
        except Exception as e:
            return self.classify(e)
        if c["out"] and res is not out:
            return "fail", {"why": "out= was not returned"}
        got, got_dtype = K.host(res)
        if got_dtype != rdt:
            return "fail", {"why": "dtype", "got": got_dtype, "expected": rdt}
        # reference
        cdt = compute_dtype(func, dtype, c["dtype_arg"])
        a = host
        if cdt is not None:
            a = rounded(a, cdt, K)
        a3 = np.ascontiguousarray(a).reshape(B, n, D)
        if spec == "fixed" and c["remainder"] == "drop":
            a3 = a3[:, : c["m"] * c["L"]]
        if order is not None:
            a3 = a3[:, order]
        if dtype in INTS and (func not in ("sum", "max", "min", "prod", *ARG) or rdt in FLOATS):
            a3 = a3.astype(np.float64)
        ref, aux = reference(func, a3, off, c["ddof"], dtype)
        if per_elem and order is not None:
            back = np.empty_like(ref)
            back[:, order] = ref
            ref = back
        if func in ARG and order is not None:
            ref = np.where(ref < n, order[np.minimum(ref, max(n - 1, 0))] if n else ref, n)
        acc = "float64" if rdt == "float64" or (dtype == "float64" and cdt is None and rdt not in INTS) else "float32"
        if dtype in ("float16", "bfloat16"):  # (always accumulated in float32, also under dtype=)
            acc = "float32"
        if func in ("var", "std") and rdt in ("float32", "float64") and dtype == "float64" and cdt is None:
            acc = "float64"
        tol = None if aux.get("exact") else tolerance(func, ref, _aux_back(aux, order, per_elem), rdt, acc)
        got3 = got.reshape(B, -1, D)
        bad = compare(got3, ref, tol, rdt)
        if bad is not None:
            bad["rdt"] = rdt
            return "fail", bad
        if c["grad"]:
            return self.check_grad(c, x, res, ref, aux, a3, off, order, B, n, D, rdt, rng, per_elem)
        return "ok", {}

    def check_grad(self, c, x, res, ref, aux, a3, off, order, B, n, D, rdt, rng, per_elem):
        torch = self.kinds.torch
        func = c["func"]
        g = rng.normal(0, 1, ref.shape)
        g[~np.isfinite(ref)] = 0.0
        if per_elem and order is not None:  # (the reference in sorted order for the derivative)
            ref_s = ref[:, order]
            g_s = g[:, order]
        else:
            ref_s, g_s = ref, g
        gt = torch.from_numpy(g.reshape(res.shape) if res.dim() else g).to(device=res.device, dtype=res.dtype)
        try:
            res.backward(gt)
            self.kinds.sync()
        except Exception as e:
            status, info = self.classify(e)
            info["phase"] = "backward"
            return status if status != "refused" else "fail", info
        if x.grad is None:
            return "fail", {"why": "no gradient"}
        gx, _ = self.kinds.host(x.grad)
        gx3 = gx.reshape(B, -1, D)
        dx, scale = reference_grad(func, a3, off, g_s, ref_s, aux, c["ddof"])
        full = np.zeros((B, gx3.shape[1], D))
        if order is not None:
            back = np.empty_like(dx)
            back[:, order] = dx
            dx = back
            sb = np.empty_like(scale)
            sb[:, order] = scale
            scale = sb
        full[:, : dx.shape[1]] = dx
        sfull = np.zeros_like(full)
        sfull[:, : dx.shape[1]] = scale
        acc = "float64" if c["dtype"] == "float64" and c["dtype_arg"] in (None, "float64") else "float32"
        gr = {"float64": 1e-9, "float32": 2e-5}[acc]
        tol = gr * (sfull + np.abs(full)) + (1e-300 if acc == "float64" else 1e-30)
        bad = compare(gx3, full, tol, c["dtype"])
        if bad is not None:
            bad["phase"] = "grad"
            return "fail", bad
        return "ok", {"grad": True}

    def classify(self, e):
        msg = f"{type(e).__name__}: {e}"
        tb = traceback.format_exc(limit=12)
        if FATAL.search(msg) or FATAL.search(tb[-2000:]):
            return "fatal", {"why": "cuda error", "error": msg[:2000], "traceback": tb[-4000:]}
        if isinstance(e, self.BackendError):
            return "refused", {"error": msg[:500]}
        if isinstance(e, (TypeError, ValueError)) and REFUSAL.search(str(e)) and _raised_by_linred(e):
            return "refused", {"error": msg[:500]}
        return "fail", {"why": "exception", "error": msg[:2000], "traceback": tb[-4000:]}


def _raised_by_linred(e):
    """Whether the innermost frame of ``e``'s traceback is linred's own code (an explicit refusal),
    not NumPy's, PyTorch's or CuPy's (an unexpected error inside them)."""
    tb = e.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return False
    name = last.tb_frame.f_code.co_filename.replace(os.sep, "/")
    return "/linred/" in name and "/site-packages/torch/" not in name


def _aux_back(aux, order, per_elem):
    if order is None or not per_elem:
        return aux
    out = dict(aux)
    for k in ("scale", "shift"):
        if k in aux and isinstance(aux[k], np.ndarray) and aux[k].ndim == 3:
            back = np.empty_like(aux[k])
            back[:, order] = aux[k]
            out[k] = back
    return out


def rounded(a, cdt, K):
    if cdt == "bfloat16":
        t = K.torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64)).to(K.torch.bfloat16)
        return t.double().numpy()
    return a.astype(np.dtype(cdt)).astype(np.float64)


# ----------------------------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------------------------


def describe(c, lengths):
    ls = np.asarray(lengths, dtype=np.int64)
    d = {k: v for k, v in c.items()}
    d["lengths_summary"] = {
        "m": len(ls),
        "n": int(ls.sum()) if len(ls) else 0,
        "min": int(ls.min()) if len(ls) else None,
        "max": int(ls.max()) if len(ls) else None,
        "mean": float(ls.mean()) if len(ls) else None,
        "empty": int((ls == 0).sum()),
    }
    if len(ls) <= 64:
        d["lengths"] = ls.tolist()
    return d


def norm_msg(msg):
    msg = re.sub(r"0x[0-9a-f]+", "0x?", msg)
    msg = re.sub(r"\d+", "N", msg)
    return msg[:180]


def case_kinds(runner, cpu):
    """The array kinds cases draw from (the same list in a run and in its --replay)."""
    wanted = ["numpy", "torch"] if cpu else ["torch", "cupy"]
    have = runner.kinds.available()
    return [k for k in wanted if k in have]


def main_loop(args):
    cpu = args.cpu
    runner = Runner(cpu)
    kinds = case_kinds(runner, cpu)
    if not kinds:
        print("no array kind available (no GPU? use --cpu)", file=sys.stderr)
        return 2
    tag = f"[w{args.worker_id}] " if args.worker_id is not None else ""
    stats = collections.Counter()
    per = collections.defaultdict(collections.Counter)
    refusals = collections.Counter()
    ratios = {}
    fails = []
    current = {"case": None, "t0": None}
    out_path = args.out
    cur_path = out_path + ".current"
    log = open(out_path, "a")  # noqa: SIM115 (written by the loop and the watchdog; closed after the loop)
    done = threading.Event()

    def watchdog():
        while not done.wait(1.0):
            t0 = current["t0"]
            if t0 is not None and time.time() - t0 > args.case_timeout:
                rec = {"status": "hang", "seconds": time.time() - t0, "case": current["case"]}
                log.write(json.dumps(rec, default=str) + "\n")
                log.flush()
                print(
                    f"{tag}HANG: case {current['case'].get('index')} ran {time.time() - t0:.0f}s: "
                    f"{current['case'].get('replay')}",
                    flush=True,
                )
                os._exit(4)

    threading.Thread(target=watchdog, daemon=True).start()
    t_start = time.time()
    index = args.start
    fatal = False
    last_report = last_print = t_start

    def summary():
        return {
            "elapsed": time.time() - t_start,
            "cases": sum(stats.values()),
            "status": dict(stats),
            "per": {k: dict(v) for k, v in per.items()},
            "refusals": dict(refusals.most_common()),
            "failures": len(fails),
            "fatal": fatal,
            "seed": args.seed,
            "next_index": index,
            "kinds": kinds,
            "ratios": ratios,
            "missing_knobs": sorted(MISSING_KNOBS),
        }

    def write_summary():
        tmp = out_path + ".summary.json.tmp"
        with open(tmp, "w") as fh:
            json.dump(summary(), fh, indent=1)
        os.replace(tmp, out_path + ".summary.json")

    while time.time() - t_start < args.seconds and (args.stop is None or index < args.stop):
        c, lengths, rng = make_case(args.seed, index, cpu, kinds)
        index += 1
        desc = describe(c, lengths)
        desc["replay"] = f"python tools/fuzz_gpu.py {'--cpu ' if cpu else ''}--replay {args.seed}:{c['index']}"
        current["case"], current["t0"] = desc, time.time()
        with open(cur_path, "w") as fh:
            json.dump(desc, fh, default=str)
        t0 = time.time()
        LAST_RATIO[0] = 0.0
        try:
            with knobs_applied(c["knobs"]):
                status, info = runner.run(c, lengths, rng)
        except Exception as e:
            status, info = runner.classify(e)
            info["phase"] = "harness"
        if status == "fail" and info.get("why") == "exception" and not cpu and not runner.kinds.healthy():
            status = "fatal"  # (the device no longer works after this case)
            info["why"] = "exception, then the device stopped working"
        dt = time.time() - t0
        current["t0"] = None
        stats[status] += 1
        per["func"][f"{c['func']}:{status}"] += 1
        per["spec"][f"{c['spec']}:{status}"] += 1
        per["kind_dtype"][f"{c['kind']}/{c['dtype']}:{status}"] += 1
        per["dist"][f"{c.get('dist')}:{status}"] += 1
        per["backend"][f"{c['backend']}:{status}"] += 1
        per["layout"][f"{c['layout']}:{status}"] += 1
        if c["grad"]:
            per["grad"][f"{c['func']}:{status}"] += 1
        if status == "ok":  # (the closest call per function and result dtype)
            rdt = expected_dtype(c["func"], c["dtype"], c["dtype_arg"])
            rkey = f"{c['func']}/{rdt}" + ("+grad" if c["grad"] else "")
            if LAST_RATIO[0] > ratios.get(rkey, (0.0, None))[0]:
                ratios[rkey] = (LAST_RATIO[0], desc["replay"])
        for key in c["knobs"]:
            per["knob"][f"{key.split(':')[1]}:{status}"] += 1
        if status == "refused":
            refusals[norm_msg(info.get("error", ""))] += 1
        elif status in ("fail", "fatal"):
            rec = {"status": status, "info": info, "case": desc, "seconds": round(dt, 3)}
            fails.append(rec)
            log.write(json.dumps(rec, default=str) + "\n")
            log.flush()
            print(
                f"{tag}[{status}] #{c['index']} {c['func']} {c['kind']}/{c['dtype']} {c['spec']} "
                f"shape={c['shape']} axis={c['axis']} -> {info.get('why')} {info.get('phase') or ''} "
                f"{str(info.get('error', ''))[:200]}  [{desc['replay']}]",
                flush=True,
            )
            if status == "fatal":
                fatal = True
                break
        if args.verbose:
            print(
                f"{tag}#{c['index']} {status} {dt:.2f}s {c['func']} {c['kind']}/{c['dtype']} {c['spec']} "
                f"{c['shape']} knobs={len(c['knobs'])}",
                flush=True,
            )
        if time.time() - last_report > 3:
            last_report = time.time()
            write_summary()
        if time.time() - last_print > 15:
            last_print = time.time()
            print(f"{tag}{time.time() - t_start:.0f}s: {sum(stats.values())} cases {dict(stats)}", flush=True)
    done.set()
    write_summary()
    log.close()
    with contextlib.suppress(OSError):
        os.remove(cur_path)
    if args.worker_id is None:
        print_summary(summary(), fails)
    return 3 if fatal else (1 if fails else 0)


def print_summary(summary, fails):
    print("=" * 78)
    print(f"cases: {summary['cases']} in {summary['elapsed']:.0f}s  status: {summary['status']}")
    for group in ("func", "spec", "kind_dtype", "dist", "backend", "layout", "grad", "knob"):
        table = summary["per"].get(group, {})
        rows = collections.defaultdict(dict)
        for k, v in table.items():
            name, status = k.rsplit(":", 1)
            rows[name][status] = v
        print(f"-- by {group}:")
        for name in sorted(rows):
            print(f"   {name:28s} " + " ".join(f"{s}={v}" for s, v in sorted(rows[name].items())))
    if summary.get("ratios"):
        print("-- largest error / tolerance among passing cases (1.0 = at the tolerance):")
        for k in sorted(summary["ratios"]):
            r, rep = summary["ratios"][k]
            print(f"   {k:28s} {r:9.3g}  [{rep}]")
    if summary.get("missing_knobs"):
        print("-- knobs skipped (no longer in the code):", ", ".join(summary["missing_knobs"]))
    if summary["refusals"]:
        print("-- refusals by message:")
        for msg, k in list(summary["refusals"].items())[:40]:
            print(f"   {k:5d}  {msg}")
    print(f"-- failures: {summary['failures']}" + ("  (FATAL CUDA error stopped the run)" if summary["fatal"] else ""))
    for rec in fails[:30]:
        cs, info = rec["case"], rec["info"]
        print(
            f"   #{cs['index']} {cs['func']} {cs['kind']}/{cs['dtype']} {cs['spec']} shape={cs['shape']} "
            f"axis={cs['axis']} {info.get('why')} {info.get('phase') or ''} {str(info.get('error', ''))[:150]}  "
            f"[{cs['replay']}]"
        )


def run_workers(args):
    procs = []
    t0 = time.time()
    if args.scratch:
        os.makedirs(args.scratch, exist_ok=True)
    stem = os.path.join(args.scratch, os.path.basename(args.out)) if args.scratch else args.out

    def worker_out(w: int) -> str:
        return f"{stem}.w{w}"

    for w in range(args.workers):
        cmd = (
            [
                sys.executable,
                os.path.abspath(__file__),
                "--seconds",
                str(args.seconds),
                "--seed",
                str(args.seed * 1000 + w),
                "--out",
                worker_out(w),
                "--case-timeout",
                str(args.case_timeout),
                "--worker-id",
                str(w),
            ]
            + (["--cpu"] if args.cpu else [])
            + (["--no-first-row-special"] if args.no_first_row_special else [])
        )
        for suffix in ("", ".summary.json", ".current"):
            with contextlib.suppress(OSError):
                os.remove(worker_out(w) + suffix)
        procs.append(subprocess.Popen(cmd))
    deadline = t0 + args.seconds + args.grace
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.time())))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            codes.append("overrun")
    total = {
        "cases": 0,
        "status": collections.Counter(),
        "per": collections.defaultdict(collections.Counter),
        "refusals": collections.Counter(),
        "failures": 0,
        "fatal": False,
        "elapsed": time.time() - t0,
        "ratios": {},
    }
    fails, notes = [], []
    with open(args.out, "w") as out:
        for w, code in enumerate(codes):
            base = worker_out(w)
            with contextlib.suppress(OSError), open(base) as fh:
                for line in fh:
                    out.write(line)
                    fails.append(json.loads(line))
            with contextlib.suppress(OSError, ValueError):
                with open(base + ".summary.json") as fh:
                    s = json.load(fh)
                total["cases"] += s["cases"]
                total["status"].update(s["status"])
                for g, t in s["per"].items():
                    total["per"][g].update(t)
                total["refusals"].update(s["refusals"])
                total["fatal"] |= s["fatal"]
                total["missing_knobs"] = sorted(set(total.get("missing_knobs", [])) | set(s.get("missing_knobs", [])))
                for k, v in s.get("ratios", {}).items():
                    if v[0] > total["ratios"].get(k, (0.0, None))[0]:
                        total["ratios"][k] = v
            if code not in (0, 1, 3):
                cur = None
                with contextlib.suppress(OSError, ValueError), open(base + ".current") as fh:
                    cur = json.load(fh)
                if code == "overrun":  # (killed at the deadline: its last case unfinished, not a failure)
                    notes.append(f"worker {w} killed at the deadline during {cur.get('replay') if cur else None}")
                    continue
                if code != 4:  # (a hang wrote its own record)
                    rec = {"status": f"worker exit {code}", "case": cur}
                    out.write(json.dumps(rec, default=str) + "\n")
                    fails.append(rec)
                notes.append(f"worker {w} exited with {code} during {cur.get('replay') if cur else None}")
    total["failures"] = len(fails)
    total["status"] = dict(total["status"])
    total["per"] = {k: dict(v) for k, v in total["per"].items()}
    total["refusals"] = dict(total["refusals"].most_common())
    print_summary(total, [f for f in fails if f.get("info") is not None and f.get("case")])
    for f in fails:
        if f.get("info") is None:
            print(f"   {f.get('status')}: {(f.get('case') or {}).get('replay')}")
    for note in notes:
        print("   note:", note)
    with open(args.out + ".summary.json", "w") as fh:
        json.dump(total, fh, indent=1)
    return 3 if total["fatal"] else (1 if fails else 0)


def replay(args):
    seed, index = (int(t) for t in args.replay.split(":"))
    runner = Runner(args.cpu)
    c, lengths, rng = make_case(seed, index, args.cpu, case_kinds(runner, args.cpu))
    print(json.dumps(describe(c, lengths), indent=1, default=str))
    try:
        with knobs_applied(c["knobs"]):
            status, info = runner.run(c, lengths, rng, verbose=True)
    except Exception as e:
        status, info = runner.classify(e)
    print(status)
    print(json.dumps(info, indent=1, default=str))
    return 0 if status in ("ok", "refused") else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=140, help="start no case after this many seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=int, default=0, help="first case index")
    p.add_argument(
        "--stop",
        type=int,
        default=None,
        help="stop before this case index (--seed S --stop I+1 re-runs a worker's cases up to case I, "
        "in the same process state)",
    )
    p.add_argument("--out", default="fuzz_failures.jsonl", help="JSON lines of failures (+ .summary.json)")
    p.add_argument("--cpu", action="store_true", help="NumPy arrays and CPU tensors (no GPU needed)")
    p.add_argument("--workers", type=int, default=1, help="processes (seeds SEED*1000+i); e.g. 8 on the GPU host")
    p.add_argument("--grace", type=float, default=20.0, help="with --workers: kill workers this long after --seconds")
    p.add_argument(
        "--no-first-row-special",
        action="store_true",
        help="no special value at a batch slice's first row (cases as drawn before that draw existed)",
    )
    p.add_argument(
        "--scratch",
        default=None,
        help="with --workers: the directory of the workers' own files (default: beside --out), so that the "
        "directory of --out holds only the merged OUT and OUT.summary.json",
    )
    p.add_argument("--case-timeout", type=float, default=60.0, help="a case running longer is reported as a hang")
    p.add_argument("--replay", help="SEED:INDEX: run one case verbosely")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--worker-id", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    global FIRST_ROW_SPECIAL
    FIRST_ROW_SPECIAL = not args.no_first_row_special
    if args.replay:
        return replay(args)
    if args.workers > 1:
        return run_workers(args)
    with contextlib.suppress(OSError):
        os.remove(args.out)
    return main_loop(args)


if __name__ == "__main__":
    sys.exit(main())
