"""Mean-pooling node features per graph, as a graph neural network's readout does.

A batch of graphs stores the features of all nodes in one ``(num_nodes, d)``
array; graph ``i`` owns rows ``offsets[i]:offsets[i+1]`` (PyTorch Geometric's
``ptr``, DGL's batch boundaries).  The per-graph mean is one segmented mean, the
per-graph sum and max one call each.  Runs on the GPU (CuPy arrays) when a CUDA
device is usable, else on the CPU; checked against a Python loop over the graphs.

Run: python examples/graph_pooling.py [--graphs 1000] [--features 64]
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
parser.add_argument("--graphs", type=int, default=1000, help="graphs in the batch")
parser.add_argument("--features", type=int, default=64, help="features per node")
args = parser.parse_args()

xp = array_module()
to_numpy = getattr(xp, "asnumpy", np.asarray)

# A batch of graphs of 0..39 nodes (an empty graph has mean NaN, sum 0, max -inf).
rng = np.random.default_rng(0)
nodes_per_graph = rng.integers(0, 40, size=args.graphs)
offsets_host = np.concatenate([[0], np.cumsum(nodes_per_graph)])
features_host = rng.standard_normal((int(offsets_host[-1]), args.features), dtype=np.float32)
features, offsets = xp.asarray(features_host), xp.asarray(offsets_host)

mean = linred.segmented_mean(features, offsets=offsets)  # (graphs, d), float32
total = linred.segmented_sum(features, offsets=offsets)
peak = linred.segmented_max(features, offsets=offsets)
print(
    f"{args.graphs} graphs, {features.shape[0]} nodes x {args.features} features ({xp.__name__}) "
    f"-> mean/sum/max pooled {tuple(mean.shape)} {mean.dtype}"
)
print("graph 0 mean (first 4 features):", to_numpy(mean[0, :4]))

# The reference: a loop over the graphs in float64.
mean, total, peak = to_numpy(mean), to_numpy(total), to_numpy(peak)
worst = 0.0
failures = 0
for i in range(args.graphs):
    rows = features_host[offsets_host[i] : offsets_host[i + 1]].astype(np.float64)
    if rows.shape[0] == 0:
        ok = np.isnan(mean[i]).all() and (total[i] == 0).all() and (peak[i] == -np.inf).all()
    else:
        err = max(
            np.abs(mean[i] - rows.mean(axis=0)).max() / max(1.0, np.abs(rows).mean()),
            np.abs(total[i] - rows.sum(axis=0)).max() / max(1.0, np.abs(rows).sum(axis=0).max()),
        )
        worst = max(worst, err)
        ok = err < 1e-5 and (peak[i] == rows.max(axis=0)).all()
    if not ok:
        failures += 1
        if failures <= 5:
            print(f"MISMATCH in graph {i} ({rows.shape[0]} nodes)")
print(f"checked {args.graphs} graphs against a float64 loop: largest relative error {worst:.1e}")
print(f"empty graphs: {int((nodes_per_graph == 0).sum())} (mean NaN, sum 0, max -inf)")
if failures:
    print(f"FAILED: {failures} graphs differ from the loop")
    sys.exit(1)
print("OK: graph_pooling")
