"""Embedding bags: the rows of a table gathered per bag, then summed, averaged or maxed.

A recommender's sparse features are bags of ids (the items a user clicked); each bag is
pooled into one vector.  PyTorch fuses the gather and the pooling in ``F.embedding_bag``;
with linred the gather is ``table[ids]`` and the pooling one segmented reduction over the
bags' offsets, which also takes per-sample weights (a weighted sum: the rows scaled first),
empty bags and any reduction linred has (``segmented_logsumexp``, ``segmented_std``...).

Runs on the GPU when PyTorch sees one, else on the CPU; checks every pooled bag and the
table's gradient against ``F.embedding_bag``.

Run: python examples/embedding_bags.py [--bags 4096] [--rows 100000] [--features 64]
"""

import argparse
import sys

import linred

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIPPED: embedding_bags: needs PyTorch")
    sys.exit(0)

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--bags", type=int, default=4096)
parser.add_argument("--rows", type=int, default=100_000, help="rows of the embedding table")
parser.add_argument("--features", type=int, default=64)
args = parser.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)

table = torch.randn(args.rows, args.features, device=device, requires_grad=True)
sizes = torch.randint(0, 30, (args.bags,), device=device)  # (a bag of 0 ids: an empty bag)
ids = torch.randint(0, args.rows, (int(sizes.sum()),), device=device)
offsets = torch.zeros(args.bags + 1, dtype=torch.int64, device=device)
offsets[1:] = torch.cumsum(sizes, 0)  # (linred's offsets end with the last bag's end)
weights = torch.rand(ids.shape[0], device=device)

failures = 0
for mode in ("sum", "mean", "max"):
    pooled = getattr(linred, f"segmented_{mode}")(table[ids], offsets=offsets)
    expected = F.embedding_bag(ids, table, offsets[:-1], mode=mode)
    # An empty bag: embedding_bag gives 0 rows; linred gives the reduction's empty value (a mean
    # NaN, a max -inf), which the caller replaces as their model needs.
    empty = sizes == 0
    if mode != "sum":
        pooled = torch.where(empty[:, None], 0.0, pooled)
    g = torch.randn_like(expected)
    (grad,) = torch.autograd.grad(pooled, table, g)
    (grad_expected,) = torch.autograd.grad(expected, table, g)
    same = torch.allclose(pooled, expected, atol=1e-5) and torch.allclose(grad, grad_expected, atol=1e-5)
    print(f"{mode:4}: {args.bags} bags ({int(empty.sum())} empty) of {args.features} features ({device}): "
          f"{'the same' if same else 'DIFFERENT'} bags and table gradient as F.embedding_bag")  # fmt: skip
    failures += not same

# Per-sample weights (mode="sum" only in F.embedding_bag): the gathered rows scaled first.
pooled = linred.segmented_sum(table[ids] * weights[:, None], offsets=offsets)
expected = F.embedding_bag(ids, table, offsets[:-1], mode="sum", per_sample_weights=weights)
same = torch.allclose(pooled, expected, atol=1e-5)
print(f"weighted sum: {'the same' if same else 'DIFFERENT'} bags as F.embedding_bag(per_sample_weights=)")
failures += not same

if failures:
    print(f"FAILED: {failures} checks")
    sys.exit(1)
print("OK: embedding_bags")
