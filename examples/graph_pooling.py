"""Mean-pooling node features per graph, as a graph neural network's readout does.

A batch of graphs stores all nodes' features in one (num_nodes, d) array; graph i
owns rows offsets[i]:offsets[i+1].  The per-graph mean is one segmented mean.

Run: python examples/graph_pooling.py
"""

import numpy as np

import linred

rng = np.random.default_rng(0)
num_graphs, d = 1000, 64
nodes_per_graph = rng.integers(0, 40, size=num_graphs)  # some graphs are empty
offsets = np.concatenate([[0], np.cumsum(nodes_per_graph)])
features = rng.standard_normal((int(offsets[-1]), d), dtype=np.float32)

pooled = linred.segmented_mean(features, offsets=offsets)  # (num_graphs, d)
summed = linred.segmented_sum(features, lengths=nodes_per_graph)
print(f"{num_graphs} graphs, {features.shape[0]} nodes, {d} features -> pooled {pooled.shape} {pooled.dtype}")

for i in range(num_graphs):
    rows = features[offsets[i] : offsets[i + 1]]
    if rows.shape[0] == 0:
        assert np.isnan(pooled[i]).all() and (summed[i] == 0).all()  # empty graph: mean NaN, sum 0
    else:
        np.testing.assert_allclose(pooled[i], rows.mean(axis=0, dtype=np.float64), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(summed[i], rows.sum(axis=0, dtype=np.float64), rtol=1e-4, atol=1e-5)
print("empty graphs:", int((nodes_per_graph == 0).sum()), "(their mean is NaN)")
print("OK: graph_pooling")
