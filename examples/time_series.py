"""Time series: windowed sums and means of a long series, and totals of variable-length sessions.

A year of per-minute readings of several sensors, ``(minutes, sensors)``, becomes
hourly sums and daily means with ``segment_length`` (no index array is built: the
series is viewed as a matrix with one row per window).  Users' sessions of
varying length, some empty, become per-session totals and means with ``lengths``.
Runs on the GPU (CuPy arrays) when a CUDA device is usable, else on the CPU;
checked against float64 NumPy.

Run: python examples/time_series.py [--days 365] [--sensors 8] [--sessions 10000]
"""

import argparse
import sys

import numpy as np

import linred


def array_module():
    """CuPy when a CUDA device is usable, else NumPy."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:  # CuPy missing, no driver, no device
        pass
    return np


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--days", type=int, default=365)
parser.add_argument("--sensors", type=int, default=8)
parser.add_argument("--sessions", type=int, default=10000)
args = parser.parse_args()

xp = array_module()
to_numpy = getattr(xp, "asnumpy", np.asarray)
rng = np.random.default_rng(0)
failures = []


def compare(label, result, reference, rtol):
    """Print the largest error of ``result`` against the float64 ``reference`` and record a mismatch."""
    got = to_numpy(result).astype(np.float64)
    scale = np.maximum(np.abs(reference), 1.0)
    err = float(np.max(np.abs(got - reference) / scale)) if got.shape == reference.shape else np.inf
    print(f"  {label:<34} shape {tuple(got.shape)!s:<12} max rel. error {err:.1e}")
    if not err <= rtol:
        failures.append(f"{label}: error {err:.1e} > {rtol:.0e} (shape {got.shape}, expected {reference.shape})")


# --- windowed sums and means: fixed-length windows of a long series
minutes = args.days * 24 * 60
readings_host = (20 + rng.standard_normal((minutes, args.sensors))).astype(np.float32)
readings = xp.asarray(readings_host)
hourly = linred.segmented_sum(readings, 60)  # (hours, sensors)
daily = linred.segmented_mean(readings, 24 * 60)  # (days, sensors)
weekly_peak = linred.segmented_max(readings[: minutes // (7 * 1440) * 7 * 1440], 7 * 1440)
print(f"{minutes} minutes x {args.sensors} sensors ({xp.__name__}, float32):")
print(f"  day 0 means: {[round(float(v), 3) for v in to_numpy(daily[0])]}")
r64 = readings_host.astype(np.float64)
compare("hourly sums (segment_length=60)", hourly, r64.reshape(-1, 60, args.sensors).sum(axis=1), 1e-5)
compare("daily means (segment_length=1440)", daily, r64.reshape(-1, 1440, args.sensors).mean(axis=1), 1e-5)
weeks = minutes // (7 * 1440)
compare("weekly max (segment_length=10080)", weekly_peak, r64[: weeks * 10080].reshape(weeks, 10080, -1).max(1), 0)

# The same windows in a (sensors, minutes) layout: segments along the last axis.
per_sensor = xp.ascontiguousarray(readings.T)
by_sensor = linred.segmented_sum(per_sensor, 60, axis=-1)  # (sensors, hours)
compare("hourly sums along axis=-1", by_sensor, r64.T.reshape(args.sensors, -1, 60).sum(axis=2), 1e-5)

# --- variable-length sessions: events per user session, some sessions empty
lengths_host = rng.poisson(30, size=args.sessions)
lengths_host[rng.random(args.sessions) < 0.05] = 0  # sessions with no events
events_host = rng.exponential(2.0, size=int(lengths_host.sum())).astype(np.float32)  # e.g. seconds per event
events, lengths = xp.asarray(events_host), xp.asarray(lengths_host)
totals = linred.segmented_sum(events, lengths=lengths)
means = linred.segmented_mean(events, lengths=lengths)
print(f"{args.sessions} sessions, {events.shape[0]} events ({xp.__name__}, float32):")
first = [round(float(t), 2) for t in to_numpy(totals[:4])]
print(f"  first sessions: lengths {lengths_host[:4].tolist()}, totals {first}")

offsets = np.concatenate([[0], np.cumsum(lengths_host)])
e64 = events_host.astype(np.float64)
nonempty = lengths_host > 0
total_ref = np.zeros(args.sessions)
total_ref[nonempty] = np.add.reduceat(e64, offsets[:-1][nonempty])
compare("session totals (lengths=)", totals, total_ref, 1e-5)
means_host = to_numpy(means)
compare("session means, non-empty", means_host[nonempty], total_ref[nonempty] / lengths_host[nonempty], 1e-5)
if not np.isnan(means_host[~nonempty]).all():
    failures.append("the mean of an empty session must be NaN")
print(f"  empty sessions: {int((~nonempty).sum())} (total 0, mean NaN)")

if failures:
    print("FAILED:", *failures, sep="\n  ")
    sys.exit(1)
print("OK: time_series")
