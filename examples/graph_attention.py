"""Graph attention: a softmax over each node's incoming edges, trained with autograd.

A graph attention layer (GAT) scores every edge, normalizes the scores over the edges that
point at the same node (a segmented softmax: PyTorch Geometric's ``softmax(src, index)``),
and sums the neighbours' features weighted by them (a segmented sum).  With the edges sorted
by their target node, the targets' CSR ``ptr`` names the segments; unsorted edges can pass
their targets as ``segment_ids=`` instead.  Gradients flow through both calls.

Runs on the GPU when PyTorch sees one, else on the CPU; checks the attention weights and the
layer's output against a float64 loop over the nodes, the gradients against the same layer
written with PyTorch's scatter operations, and that a few training steps lower the loss.

Run: python examples/graph_attention.py [--nodes 2000] [--edges 20000] [--features 32]
"""

import argparse
import sys

import numpy as np

import linred

try:
    import torch
except ImportError:
    print("SKIPPED: graph_attention: needs PyTorch")
    sys.exit(0)

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--nodes", type=int, default=2000)
parser.add_argument("--edges", type=int, default=20000)
parser.add_argument("--features", type=int, default=32)
args = parser.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)

# A random graph; edges sorted by their target node, whose CSR ptr names each node's incoming
# edges (a node with none has an empty segment: no weights, and a zero output row).
n, d = args.nodes, args.features
src = torch.randint(0, n, (args.edges,), device=device)
dst = torch.randint(0, n, (args.edges,), device=device)
dst, order = torch.sort(dst)
src = src[order]
ptr = torch.zeros(n + 1, dtype=torch.int64, device=device)
ptr[1:] = torch.cumsum(torch.bincount(dst, minlength=n), 0)

x = torch.randn(n, d, device=device)
W = (torch.randn(d, d, device=device) / d**0.5).requires_grad_()
a_src = (torch.randn(d, device=device) / d**0.5).requires_grad_()
a_dst = (torch.randn(d, device=device) / d**0.5).requires_grad_()


def layer(x, src, dst, offsets=None, segment_ids=None):
    """One attention head over the edges ``src -> dst``: the edges' weights (a softmax over each
    target's edges) and the targets' new features (the weighted sum of their sources')."""
    h = x @ W
    score = torch.nn.functional.leaky_relu(h[src] @ a_src + h[dst] @ a_dst, 0.2)
    spec = {"offsets": offsets} if offsets is not None else {"segment_ids": segment_ids, "num_segments": n}
    alpha = linred.segmented_softmax(score, **spec)
    return alpha, linred.segmented_sum(alpha[:, None] * h[src], **spec)


def scatter_layer(x, src, dst):
    """The same head with PyTorch's scatter operations (as PyTorch Geometric writes it)."""
    h = x @ W
    score = torch.nn.functional.leaky_relu(h[src] @ a_src + h[dst] @ a_dst, 0.2)
    top = torch.full((n,), -torch.inf, dtype=score.dtype, device=device).scatter_reduce(
        0, dst, score.detach(), "amax", include_self=True
    )
    e = (score - top[dst]).exp()
    alpha = e / torch.zeros(n, dtype=e.dtype, device=device).index_add(0, dst, e)[dst]
    return alpha, torch.zeros(n, d, dtype=h.dtype, device=device).index_add(0, dst, alpha[:, None] * h[src])


failures = 0

# 1. The weights and the output against a float64 loop over the nodes.
alpha, out = layer(x, src, dst, offsets=ptr)
with torch.no_grad():
    h64 = (x.double() @ W.double()).cpu().numpy()
    s64 = h64[src.cpu()] @ a_src.double().cpu().numpy() + h64[dst.cpu()] @ a_dst.double().cpu().numpy()
s64 = np.where(s64 > 0, s64, 0.2 * s64)
bounds, sources = ptr.cpu().numpy(), src.cpu().numpy()
worst = 0.0
for v in range(n):
    lo, hi = bounds[v], bounds[v + 1]
    e = np.exp(s64[lo:hi] - s64[lo:hi].max(initial=0.0))
    weights = e / e.sum() if hi > lo else e
    expected = weights @ h64[sources[lo:hi]] if hi > lo else np.zeros(d)
    got_w, got_out = alpha[lo:hi].detach().double().cpu().numpy(), out[v].detach().double().cpu().numpy()
    worst = max(worst, np.abs(got_w - weights).max(initial=0.0), np.abs(got_out - expected).max())
print(f"{n} nodes, {args.edges} edges, {d} features ({device}): attention weights and outputs "
      f"against a float64 loop, largest error {worst:.1e}")  # fmt: skip
if worst > 1e-4:
    print("MISMATCH: the layer differs from the float64 loop")
    failures += 1

# 2. The same with the targets as unsorted segment ids (the edges shuffled).
shuffle = torch.randperm(args.edges, device=device)
alpha_ids, out_ids = layer(x, src[shuffle], dst[shuffle], segment_ids=dst[shuffle])
alpha_ids = torch.empty_like(alpha_ids).scatter_(0, shuffle, alpha_ids)  # (back in the sorted order)
same = torch.allclose(alpha_ids, alpha, atol=1e-6) and torch.allclose(out_ids, out, atol=1e-5)
print(f"the same layer with unsorted segment ids: {'the same' if same else 'DIFFERENT'} weights and outputs")
failures += not same

# 3. The gradients against the scatter layer's.
target = torch.randn(n, d, device=device)


def loss_of(forward):
    return ((forward() - target) ** 2).mean()


params = (W, a_src, a_dst)
grads = torch.autograd.grad(loss_of(lambda: layer(x, src, dst, offsets=ptr)[1]), params)
expected = torch.autograd.grad(loss_of(lambda: scatter_layer(x, src, dst)[1]), params)
gap = max(((g - e).abs().max() / e.abs().max()).item() for g, e in zip(grads, expected, strict=True))
print(f"gradients of W and the attention vectors against PyTorch's scatter operations: largest gap {gap:.1e}")
if gap > 1e-4:
    print("MISMATCH: the gradients differ")
    failures += 1

# 4. A few training steps lower the loss.
optimizer = torch.optim.Adam(params, lr=0.01)
losses = []
for _ in range(30):
    optimizer.zero_grad()
    loss = loss_of(lambda: layer(x, src, dst, offsets=ptr)[1])
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
print(f"training: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps")
if not losses[-1] < losses[0]:
    print("FAILED: training did not lower the loss")
    failures += 1

if failures:
    print(f"FAILED: {failures} checks")
    sys.exit(1)
print("OK: graph_attention")
