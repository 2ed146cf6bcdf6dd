"""PyTorch as a first-class caller: autograd, torch.compile, arg-reductions.

Gradients are checked with ``torch.autograd.gradcheck`` (finite differences in
float64) and ``gradgradcheck`` for sum and mean, on the CPU and, where there is
one, on a CUDA device; compiled models against the same model run eagerly.
"""

from __future__ import annotations

import itertools
import re
import warnings

import numpy as np
import pytest
from support import HAS_TORCH, HAS_TORCH_CUDA, long_feature_segments_forced

import linred

pytestmark = pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch")

if HAS_TORCH:
    import torch

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")]),
]
REDUCTIONS = ("sum", "mean", "max", "min")

#: (segment arguments, axis, shape): fixed lengths and offsets with empty segments, along
#: either axis of a 2-D input (feature columns carried), and a 3-D one
SPECS = [
    ({"segment_length": 4}, 0, (12, 3)),
    ({"segment_length": 3}, 1, (2, 12)),
    ({"offsets": [0, 2, 2, 7, 12]}, 0, (12, 3)),
    ({"lengths": [5, 0, 7]}, -1, (2, 12)),
    ({"offsets": [0, 1, 5, 6]}, 1, (2, 6, 2)),
]


def _call(reduction, x, spec):
    kwargs, axis, _ = spec
    kwargs = dict(kwargs)
    L = kwargs.pop("segment_length", None)
    for name in ("offsets", "lengths"):
        if name in kwargs:
            kwargs[name] = torch.tensor(kwargs[name], device=x.device)
    return getattr(linred, f"segmented_{reduction}")(x, L, axis=axis, **kwargs)


def _nonempty(spec):
    kwargs, _, _ = spec
    return 0 not in kwargs.get("lengths", []) and len(set(kwargs.get("offsets", []))) == len(kwargs.get("offsets", []))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{next(iter(s[0]))}-axis{s[1]}-{len(s[2])}d")
def test_gradcheck(device, reduction, spec):
    if reduction != "sum" and not _nonempty(spec):
        # An empty segment's mean (NaN) and max/min (-inf/inf) have no finite differences: its
        # gradient (none flows to any element) is checked by test_empty_segments_get_no_gradient.
        spec = ({"segment_length": 2}, spec[1], spec[2])
    torch.manual_seed(0)
    # distinct values: finite differences of max/min are defined only without ties
    x = torch.randperm(int(np.prod(spec[2])), dtype=torch.float64).reshape(spec[2]).to(device) / 7
    x.requires_grad_(True)
    y = _call(reduction, x, spec)
    assert y.requires_grad and y.grad_fn is not None
    assert torch.autograd.gradcheck(lambda t: _call(reduction, t, spec), (x,))
    if reduction in ("sum", "mean"):
        assert torch.autograd.gradgradcheck(lambda t: _call(reduction, t, spec), (x,))


@pytest.mark.parametrize("device", DEVICES)
def test_max_gradient_goes_to_the_first_of_tied_elements(device):
    x = torch.tensor([1.0, 3.0, 3.0, 2.0, 5.0, 5.0], device=device, requires_grad=True)
    linred.segmented_max(x, 3).sum().backward()
    assert x.grad.tolist() == [0, 1, 0, 0, 1, 0]
    x.grad = None
    linred.segmented_min(x, 2).sum().backward()
    assert x.grad.tolist() == [1, 0, 0, 1, 1, 0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["max", "min"])
@pytest.mark.parametrize("dtypes", [("float32", "float16"), ("float32", "bfloat16"), ("float64", "float32"),
                                    ("float64", "float16"), ("float32", "float64")])  # fmt: skip
@pytest.mark.parametrize("how", ["fixed", "offsets", "ids", "func"])
def test_max_gradient_with_another_result_dtype(device, reduction, dtypes, how):
    """A result of another dtype (dtype=) is the extreme rounded, which may equal no element: the
    gradient goes to the segment's first extreme of x itself, as NumPy's float64 argmax finds it,
    values that round to the same result included (0.30001 beside 0.3)."""
    x_dtype, dtype = (getattr(torch, d) for d in dtypes)
    values = [0.1, 0.7, 0.3, 0.30001, 0.3, 0.2, 0.25, 0.25000003, 0.1]
    x = torch.tensor(values, dtype=x_dtype, device=device, requires_grad=True)
    f = getattr(linred, f"segmented_{reduction}")
    call = {
        "fixed": lambda t: f(t, 3, dtype=dtype),
        "offsets": lambda t: f(t, offsets=torch.tensor([0, 3, 6, 9], device=device), dtype=dtype),
        "ids": lambda t: f(
            t, segment_ids=torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2], device=device), num_segments=3, dtype=dtype
        ),
        "func": lambda t: f(t, 3, dtype=dtype),
    }[how]
    g = torch.tensor([1.0, 2.0, 4.0], dtype=dtype, device=device)
    if how == "func":
        gx = torch.func.grad(lambda t: (call(t) * g).sum())(x.detach())
    else:
        (gx,) = torch.autograd.grad(call(x), x, g)
    xs = x.detach().double().cpu().numpy().reshape(3, 3)
    first = (xs.argmax if reduction == "max" else xs.argmin)(axis=1)
    expected = np.zeros((3, 3))
    expected[np.arange(3), first] = [1.0, 2.0, 4.0]
    assert gx.dtype == x_dtype
    np.testing.assert_array_equal(gx.double().cpu().numpy(), expected.reshape(-1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_empty_segments_get_no_gradient(device, reduction):
    x = torch.arange(1.0, 7.0, device=device, requires_grad=True)
    offsets = torch.tensor([0, 0, 4, 4, 6], device=device)
    y = getattr(linred, f"segmented_{reduction}")(x, offsets=offsets)
    torch.where(torch.isfinite(y), y, 0).sum().backward()
    expected = {"sum": [1] * 6, "mean": [0.25] * 4 + [0.5] * 2, "max": [0, 0, 0, 1, 0, 1], "min": [1, 0, 0, 0, 1, 0]}
    assert x.grad.tolist() == expected[reduction]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", [*REDUCTIONS, "prod", "softmax", "logsumexp", "var"])
@pytest.mark.parametrize("index_dtype", ["int8", "int16", "uint8", "uint16", "uint32"])
def test_narrow_index_dtypes_get_their_gradient(device, reduction, index_dtype):
    """Offsets and lengths of narrow or unsigned integers, as tensors or NumPy arrays: the same
    gradient as int64 ones (the backward's repeat_interleave, diff and cumsum lack those dtypes)."""
    x = torch.tensor([3.0, -1.0, 2.0, 5.0, 4.0, 0.5, 2.0], dtype=torch.float64, device=device)
    offsets, lengths = np.array([0, 2, 2, 6, 7]), np.array([2, 0, 4, 1])
    f = getattr(linred, f"segmented_{reduction}")
    for name, values in (("offsets", offsets), ("lengths", lengths)):
        grads = []
        for given in (torch.tensor(values, device=device), torch.tensor(values.astype(index_dtype), device=device),
                      values.astype(index_dtype)):  # fmt: skip
            if device == "cuda" and isinstance(given, np.ndarray):
                continue  # (host arrays with CUDA data are refused)
            leaf = x.clone().requires_grad_()
            y = f(leaf, **{name: given})
            # (weighted: a softmax's plain sum is 1 a segment, whose gradient is 0)
            w = torch.linspace(1.0, 2.0, y.numel(), dtype=y.dtype, device=device).reshape(y.shape)
            (torch.where(torch.isfinite(y), y, 0) * w).sum().backward()
            grads.append(leaf.grad)
        for g in grads[1:]:
            torch.testing.assert_close(g, grads[0], equal_nan=True)
    assert grads[0].abs().sum() > 0


def test_a_tensor_without_grad_takes_the_plain_path():
    x = torch.arange(8.0)
    y = linred.segmented_sum(x, 4)
    assert y.grad_fn is None and not y.requires_grad
    with torch.no_grad():
        assert linred.segmented_sum(x.requires_grad_(True), 4).grad_fn is None


@pytest.mark.parametrize("name", ["sum", "mean", "prod", "softmax", "var", "logsumexp"])
@pytest.mark.parametrize("spec", ["offsets", "lengths", "segment_ids"])
@pytest.mark.parametrize(
    "kind",
    [
        "numpy",
        pytest.param("cupy", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")]),
    ],
)
def test_segment_arrays_changed_before_backward_change_no_gradient(name, spec, kind):
    """What the backward keeps of NumPy (or CuPy) segment arguments is a copy: the caller's buffer
    reused before backward() leaves the gradient of the call that was made (a tensor's version
    counter raises instead; here nothing would have said that the gradient belongs to other
    segments)."""
    if kind == "cupy":
        cupy = pytest.importorskip("cupy")
    device = "cuda" if kind == "cupy" else "cpu"
    if spec == "segment_ids" and name in ("sum", "mean", "prod"):
        pytest.skip("ids of these reductions are converted to offsets of their own (nothing of the caller's kept)")
    rng = np.random.default_rng(3)
    values = rng.standard_normal(12) + 2.0
    given = {"offsets": np.array([0, 2, 7, 12]), "lengths": np.array([2, 5, 5]),
             "segment_ids": np.array([1, 0, 1, 1, 0, 2, 2, 0, 1, 2, 0, 1])}[spec]  # fmt: skip
    extra = {"num_segments": 3} if spec == "segment_ids" else {}
    fn = getattr(linred, f"segmented_{name}")
    g = None

    def grad(array, mutate):
        nonlocal g
        x = torch.tensor(values, device=device, requires_grad=True)
        y = fn(x, **{spec: array}, **extra)
        if g is None:
            g = torch.tensor(rng.standard_normal(tuple(y.shape)), device=device)
        if mutate:
            array[...] = array[::-1].copy()
        (y * g).sum().backward()
        return x.grad.cpu().numpy()

    expected = grad(given.copy(), mutate=False)
    array = given.copy() if kind == "numpy" else cupy.asarray(given)
    np.testing.assert_allclose(grad(array, mutate=True), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.int64, "int8", torch.int32])
def test_an_integer_sum_of_a_tensor_that_requires_grad_is_refused(dtype):
    """As torch.sum refuses it: autograd cannot differentiate an integer result, which would come
    back without a grad_fn (a model's training silently stopping there)."""
    x = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    for fn in (linred.segmented_sum, linred.segmented_max):
        if fn is linred.segmented_sum:
            with pytest.raises(TypeError, match="integer result, which autograd cannot differentiate"):
                fn(x, 3, dtype=dtype)
        else:  # (the extreme of the cast elements, as x.to(int).amax(): no gradient there either)
            assert fn(x, 3, dtype=dtype).grad_fn is None
        npdtype = np.dtype(str(dtype).removeprefix("torch."))
        ufunc = np.add if fn is linred.segmented_sum else np.maximum  # (the elements cast first, then reduced)
        expected = ufunc.reduce(x.detach().numpy().astype(npdtype).reshape(2, 3, 3), axis=1)
        got = fn(x.detach(), 3, dtype=dtype)
        np.testing.assert_array_equal(got.numpy(), expected.astype(got.numpy().dtype))
        with torch.no_grad():
            assert fn(x, 3, dtype=dtype).dtype == got.dtype
    assert linred.segmented_sum(x, 3, dtype=torch.float32).grad_fn is not None


def test_out_and_stream_are_refused_with_autograd():
    x = torch.arange(8.0, requires_grad=True)
    with pytest.raises(TypeError, match="out= and stream= are not supported for a tensor that requires grad"):
        linred.segmented_sum(x, 4, out=torch.empty(2))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    """A model that calls linred compiles as one graph (no graph break) and matches eager."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4).to(device)
    ptr = torch.tensor([0, 3, 3, 10, 16], device=device)

    def model(feats, ptr):
        h = torch.relu(lin(feats))
        return linred.segmented_mean(h, offsets=ptr) + linred.segmented_max(h, offsets=ptr, check=False)

    feats = torch.randn(16, 8, device=device)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = compiled(feats, ptr)
    want = model(feats, ptr)
    torch.testing.assert_close(got, want, equal_nan=True)
    explained = torch._dynamo.explain(model)(feats, ptr)
    assert explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"segment_length": True}, TypeError, "segment_length must be an integer; got bool True"),
        ({"segment_length": 2.0}, TypeError, "segment_length must be an integer; got float 2.0"),
        ({"segment_length": 0}, ValueError, "segment_length must be >= 1; got 0"),
        ({"segment_length": -2}, ValueError, "segment_length must be >= 1; got -2"),
        ({"segment_length": 2, "axis": True}, TypeError, "axis must be an integer"),
        ({"segment_length": 2, "check": 1}, TypeError, "check must be True or False"),
    ],
)
@pytest.mark.parametrize("name", ["sum", "softmax"])
def test_compiled_calls_refuse_what_eager_calls_refuse(kwargs, error, message, name):
    """Inside torch.compile (without fullgraph: the graph breaks and the call raises) the eager
    call's error, where the operator's fake took True for a length of 1, divided by a length of 0
    or made a negative dimension."""
    fn = getattr(linred, f"segmented_{name}")
    x = torch.randn(4, 2)
    with pytest.raises(error, match=re.escape(message)):
        fn(x, **kwargs)
    torch._dynamo.reset()
    with pytest.raises(error, match=re.escape(message)):
        torch.compile(lambda t: fn(t, **kwargs), backend="eager")(x)
    with pytest.raises(ValueError, match="x must have at least one dimension"):
        torch.compile(lambda t: fn(t, 1), backend="eager")(torch.tensor(3.0))


def test_compile_numpy_input_still_runs_eagerly():
    def f(a):
        return linred.segmented_sum(a, 2)

    compiled = torch.compile(f, backend="eager")
    np.testing.assert_array_equal(compiled(np.arange(4.0)), [1, 5])


def test_gnn_trains_like_torch_segment_reduce():
    """Two message-passing layers and mean pooling: the loss curves of linred's pooling and
    torch.segment_reduce's agree step by step."""

    def run(pool):
        torch.manual_seed(0)
        n, graphs = 60, 6
        feats = torch.randn(n, 5)
        ptr = torch.tensor([0, 7, 15, 30, 31, 45, 60])
        edges = torch.randint(0, n, (2, 200))
        target = torch.randn(graphs, 1)
        layers = torch.nn.ModuleList([torch.nn.Linear(5, 16), torch.nn.Linear(16, 16)])
        head = torch.nn.Linear(16, 1)
        opt = torch.optim.SGD([*layers.parameters(), *head.parameters()], lr=0.05)
        losses = []
        for _ in range(20):
            h = feats
            for layer in layers:
                msg = torch.zeros(n, h.shape[1]).index_add_(0, edges[1], h[edges[0]])
                h = torch.relu(layer(h + msg / 10))
            loss = torch.nn.functional.mse_loss(head(pool(h, ptr)), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    ours = run(lambda h, ptr: linred.segmented_mean(h, offsets=ptr))
    theirs = run(lambda h, ptr: torch.segment_reduce(h, "mean", offsets=ptr, axis=0))
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert ours[-1] < ours[0]


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_argmax_argmin_against_numpy(kind):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, size=(3, 20)).astype(np.float32)  # many ties
    x[1, 5] = np.nan
    offsets = np.array([0, 0, 6, 6, 13, 20])
    xs = x if kind == "numpy" else torch.from_numpy(x)
    for which, npfn in (("argmax", np.argmax), ("argmin", np.argmin)):
        got = getattr(linred, f"segmented_{which}")(xs, offsets=offsets, axis=1)
        got = np.asarray(got)
        assert got.dtype == np.int64 and got.shape == (3, 5)
        for i in range(5):
            a, b = offsets[i], offsets[i + 1]
            for r in range(3):
                expected = 20 if a == b else a + npfn(x[r, a:b])
                assert got[r, i] == expected, (which, r, i)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("spec", ["fixed", "offsets"])
def test_cuda_graph_captures_a_call(spec):
    """check=False calls are captured and replayed; a check, which must read back, is refused."""
    x = torch.randn(4096, 16, device="cuda")
    ptr = torch.tensor([0, 100, 100, 3000, 4096], device="cuda")

    def call(check):
        if spec == "fixed":
            return linred.segmented_sum(x, 64, check=check)
        return linred.segmented_sum(x, offsets=ptr, check=check)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm: plans made and kernels compiled before the capture
            call(False)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # captured where the warm-up ran
        y = call(False)
    x.copy_(torch.randn(4096, 16, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, call(True), rtol=1e-5, atol=1e-4)
    if spec == "offsets":
        with (
            pytest.raises(RuntimeError, match=r"check=True\) reads them back"),
            torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream),
        ):
            call(True)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
def test_cuda_graph_replays_of_long_feature_segments():
    """features_reduce cutting long segments into tiles, captured: every replay counts its pieces
    from zero (a replay on bad offsets leaves nothing for the next), and an eager call after a
    capture finds its counts zeroed."""
    with long_feature_segments_forced():
        lengths = [1000, 2000, *([20] * 50), 300, 0, 7, 1030]
        ptr = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
        x = torch.randn(int(ptr[-1]), 64, device="cuda", dtype=torch.float64)
        good = ptr.clone()
        out = torch.empty(len(lengths), 64, device="cuda", dtype=torch.float64)
        expected = torch.segment_reduce(x, "sum", offsets=ptr, axis=0)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            linred.segmented_sum(x, offsets=ptr, check=False, out=out)  # (plan and kernels made)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            linred.segmented_sum(x, offsets=ptr, check=False, out=out)
        for bad in (False, True, False, False):
            out.fill_(float("nan"))
            if bad:  # segment 1 ends before it starts: searches of segment 0's tiles go astray
                ptr[2] = 500
            graph.replay()
            torch.cuda.synchronize()
            ptr.copy_(good)
            if not bad:
                torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-9)
        torch.testing.assert_close(linred.segmented_sum(x, offsets=ptr, check=False), expected, rtol=1e-12, atol=1e-9)


def test_parameters_and_tensor_subclasses():
    """nn.Parameter (a Tensor subclass) is reduced, with its gradient, like a tensor."""
    p = torch.nn.Parameter(torch.arange(6.0, dtype=torch.float64))
    out = linred.segmented_sum(p, 3)
    assert out.grad_fn is not None
    out.sum().backward()
    torch.testing.assert_close(p.grad, torch.ones(6, dtype=torch.float64))
    with torch.no_grad():
        torch.testing.assert_close(linred.segmented_max(p, 3), torch.tensor([2.0, 5.0], dtype=torch.float64))
    assert linred.segmented_argmax(p.detach(), 3).tolist() == [2, 5]


def test_first_tensor_after_importing_linred_first_gets_its_gradient():
    """linred imported before PyTorch: the first tensor registers the operator and is served by it."""
    import subprocess
    import sys

    code = (
        "import linred, torch\n"
        "t = torch.rand(6, dtype=torch.float64, requires_grad=True)\n"
        "assert linred.segmented_sum(t, 3).grad_fn is not None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("spec", ["offsets", "lengths"])
@pytest.mark.parametrize("shape", [(1000, 16), (257, 3, 5), (40, 2)])
def test_cuda_feature_rows_backward_spreads_each_segments_gradient(reduction, spec, shape):
    """The backward of CUDA feature rows takes torch.segment_reduce's backward kernel: the same
    values as spreading each segment's gradient over its rows, empty segments included."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    n = shape[0]
    rng = np.random.default_rng(n)
    cuts = np.sort(rng.integers(0, n + 1, 39))
    cuts[5] = cuts[4]  # an empty segment in the middle
    offsets = np.concatenate([[0, 0], cuts, [n]])  # and one at the start
    lengths = np.diff(offsets)
    x = torch.rand(shape, dtype=torch.float64, device="cuda", requires_grad=True)
    given = offsets if spec == "offsets" else lengths
    segments = {spec: torch.as_tensor(given, device="cuda")}
    result = getattr(linred, f"segmented_{reduction}")(x, **segments)
    g = torch.rand_like(result)
    result.backward(g)
    counts = torch.as_tensor(lengths, device="cuda")
    per_segment = g / counts.clamp(min=1).reshape(-1, *([1] * (len(shape) - 1))) if reduction == "mean" else g
    expected = per_segment.repeat_interleave(counts, dim=0, output_size=n)
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["offsets", "lengths"])
def test_cuda_feature_rows_max_backward_goes_to_the_first_maximum(spec):
    """Ties (small integers) and empty segments: each segment's gradient goes to the first row
    that attains its maximum, per column (the spread of the maxima takes the fast kernel)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rng = np.random.default_rng(11)
    n, d = 3000, 8
    offsets = np.concatenate([[0, 0], np.sort(rng.integers(0, n + 1, 30)), [n]])
    values = rng.integers(0, 4, (n, d)).astype(np.float64)
    x = torch.tensor(values, device="cuda", requires_grad=True)
    given = offsets if spec == "offsets" else np.diff(offsets)
    result = linred.segmented_max(x, **{spec: torch.as_tensor(given, device="cuda")})
    g = torch.rand_like(result)
    result.backward(g)
    expected = np.zeros((n, d))
    gh = g.cpu().numpy()
    for s, (a, b) in enumerate(itertools.pairwise(offsets)):
        if b > a:
            first = a + values[a:b].argmax(axis=0)
            expected[first, np.arange(d)] += gh[s]
    np.testing.assert_array_equal(x.grad.cpu().numpy(), expected)


@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min", "prod"])
def test_empty_segment_lists_for_a_tensor_that_requires_grad(reduction):
    """``lengths=[]`` (and ``offsets=[0]``) over an empty tensor that requires grad: an empty
    result with a gradient, as without grad (``torch.as_tensor([])`` is float32, which the
    segment parser refused with a TypeError)."""
    fn = getattr(linred, f"segmented_{reduction}")
    for kwargs in ({"lengths": []}, {"offsets": [0]}):
        x = torch.zeros(0, requires_grad=True)
        got = fn(x, **kwargs)
        assert got.shape == (0,) and got.requires_grad
        assert fn(torch.zeros(0), **kwargs).shape == (0,)
    with pytest.raises(TypeError, match="lengths must be an array of integers"):
        fn(torch.zeros(3, requires_grad=True), lengths=[1.0, 2.0])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min", "prod"])
def test_no_segments_of_empty_feature_rows_get_an_empty_gradient(device, reduction):
    """offsets=[0] over (0, d) rows that require grad: an empty result, and backward gives an
    empty gradient (on CUDA the sum's and mean's spread took grad[0] of a gradient of no rows)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.zeros((0, 8), device=device, requires_grad=True)
    got = getattr(linred, f"segmented_{reduction}")(x, offsets=torch.tensor([0], device=device))
    assert got.shape == (0, 8)
    got.sum().backward()
    assert x.grad.shape == (0, 8)


@pytest.mark.parametrize("device", DEVICES)
def test_conjugate_and_negative_views_after_a_plain_tensor(device, clean_plan_cache):
    """Plans prepare a plain tensor by detaching it only; a conjugated or negated view (another
    key of the function's cache, or a mismatching array for a plan object) is still resolved."""
    rng = np.random.default_rng(3)
    z = rng.standard_normal(24) + 1j * rng.standard_normal(24)
    t = torch.tensor(z, device=device)
    views = {
        "conj": (t.conj(), np.conj(z)),
        "neg": (t.conj().imag, -z.imag),
        "strided conj": (t.conj()[::2], np.conj(z)[::2]),
    }
    plain = torch.tensor(z.real.copy(), device=device)
    for _ in range(2):  # planned, then from the cache
        np.testing.assert_allclose(linred.segmented_sum(t, 4).cpu().numpy(), z.reshape(-1, 4).sum(1))
        np.testing.assert_allclose(linred.segmented_sum(plain, 4).cpu().numpy(), z.real.reshape(-1, 4).sum(1))
        for name, (view, ref) in views.items():
            got = linred.segmented_sum(view, 4).cpu().numpy()
            np.testing.assert_allclose(got, ref.reshape(-1, 4).sum(1), err_msg=name)
    plan = linred.SegmentedReduction(t, 4)
    np.testing.assert_allclose(plan(t.conj()).cpu().numpy(), np.conj(z).reshape(-1, 4).sum(1))
    np.testing.assert_allclose(plan(t).cpu().numpy(), z.reshape(-1, 4).sum(1))


def test_cpu_tensors_run_as_numpy_views(clean_plan_cache):
    """A CPU tensor's call (its offsets, lengths and out too) takes the plans of NumPy arrays
    through views of their memory; the result is a tensor, out is returned as given, and a
    bfloat16 result comes back as bfloat16."""
    from linred import _plan_cache

    rng = np.random.default_rng(5)
    data = rng.standard_normal((12, 3)).astype(np.float32)
    x = torch.from_numpy(data.copy())
    ref = np.add.reduceat(data.astype(np.float64), [0, 2, 7], axis=0)
    got = linred.segmented_sum(x, offsets=torch.tensor([0, 2, 7, 12]))
    assert type(got) is torch.Tensor and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-6)
    assert {key[1][2] for key in _plan_cache._plans} == {np.dtype(np.float32)}  # a NumPy array's key
    out = torch.empty(3, 3)
    assert linred.segmented_sum(x, lengths=torch.tensor([2, 5, 5]), out=out) is out
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)
    half = linred.segmented_sum(x, offsets=[0, 2, 7, 12], dtype="bfloat16")
    assert half.dtype == torch.bfloat16
    np.testing.assert_allclose(half.float().numpy(), ref, rtol=1e-2)
    bf = x.to(torch.bfloat16)  # NumPy cannot view it: the tensor's own route, the same result
    np.testing.assert_allclose(linred.segmented_sum(bf, 4).float().numpy(),
                               bf.float().numpy().reshape(3, 4, 3).sum(1), rtol=1e-2)  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", ["function", "plan"])
def test_out_is_written_as_an_in_place_operation(device, route, clean_plan_cache):
    """An out= tensor written by linred has its version counter bumped, so that autograd refuses
    a backward through a value it saved before; an out that requires grad is refused in grad
    mode (as PyTorch's out= functions refuse it) and filled under torch.no_grad()."""
    x = torch.arange(8.0, device=device)
    call = (
        (lambda t, out: linred.segmented_sum(t, 4, out=out)) if route == "function" else linred.SegmentedReduction(x, 4)
    )
    out = torch.zeros(2, device=device)
    a = torch.ones(2, device=device, requires_grad=True)
    y = (a * out).sum()  # autograd saves out
    assert call(x, out=out) is out
    assert out._version > 0
    np.testing.assert_array_equal(out.cpu().numpy(), [6.0, 22.0])
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    leaf = torch.zeros(2, device=device, requires_grad=True)
    with pytest.raises(TypeError, match="out requires grad"):
        call(x, out=leaf)
    with torch.no_grad():
        assert call(x, out=leaf) is leaf
    np.testing.assert_array_equal(leaf.detach().cpu().numpy(), [6.0, 22.0])


def test_forward_mode_ad_is_refused():
    """A dual tensor (forward-mode AD, also through torch.func.jvp) is refused rather than
    reduced into a result with no tangent; outside a dual level the same tensor reduces."""
    import torch.autograd.forward_ad as fwAD

    x, tangent = torch.arange(4.0), torch.ones(4)
    with fwAD.dual_level():
        with pytest.raises(TypeError, match="forward-mode AD"):
            linred.segmented_sum(fwAD.make_dual(x, tangent), 2)
        np.testing.assert_array_equal(linred.segmented_sum(x, 2).numpy(), [1.0, 5.0])  # no tangent: served
    with pytest.raises(TypeError, match="forward-mode AD"):
        torch.func.jvp(lambda a: linred.segmented_sum(a, 2), (x,), (tangent,))


# -- torch.func: grad, vmap, jacrev ----------------------------------------------------------

FUNC_OFFSETS = [0, 2, 2, 7, 12]  # (an empty segment among them)


def _segment_reference(reduction, x, offsets):
    """float64 NumPy: ``reduction`` of each segment of ``x`` along axis 0 (NaN for an empty
    segment's mean, -inf/inf for its max/min, as linred documents)."""
    empty = {"sum": 0.0, "mean": np.nan, "max": -np.inf, "min": np.inf, "prod": 1.0}[reduction]
    rows = []
    for a, b in itertools.pairwise(offsets):
        seg = x[a:b]
        rows.append(getattr(np, reduction)(seg, axis=0) if b > a else np.full(x.shape[1:], empty))
    return np.array(rows)


def _gradient_reference(reduction, x, offsets, w):
    """float64 NumPy: d/dx of ``sum(w * reduction(x))`` over the segments along axis 0; max and
    min send each segment's weight to its first extreme, prod to the product of the others."""
    g = np.zeros_like(x)
    for s, (a, b) in enumerate(itertools.pairwise(offsets)):
        if b == a:
            continue
        seg = x[a:b]
        if reduction == "sum":
            g[a:b] = w[s]
        elif reduction == "mean":
            g[a:b] = w[s] / (b - a)
        elif reduction in ("max", "min"):
            first = (np.argmax if reduction == "max" else np.argmin)(seg, axis=0)
            for j, i in enumerate(first):
                g[a + i, j] = w[s, j]
        else:
            for i in range(b - a):
                g[a + i] = w[s] * np.prod(np.delete(seg, i, axis=0), axis=0)
    return g


FUNC_REDUCTIONS = ("sum", "mean", "max", "min", "prod")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", FUNC_REDUCTIONS)
def test_func_grad_matches_numpy(device, reduction):
    """torch.func.grad (and jacrev) through each reduction gives the float64 NumPy gradient."""
    rng = np.random.default_rng(5)
    xn, wn = rng.standard_normal((12, 3)), rng.standard_normal((4, 3))
    x, w = torch.tensor(xn, device=device), torch.tensor(wn, device=device)
    ptr = torch.tensor(FUNC_OFFSETS, device=device)
    f = getattr(linred, f"segmented_{reduction}")

    def loss(t):
        y = f(t, offsets=ptr)
        return (torch.where(torch.isfinite(y), y, 0) * w).sum()

    expected = _gradient_reference(reduction, xn, FUNC_OFFSETS, wn)
    np.testing.assert_allclose(torch.func.grad(loss)(x).cpu().numpy(), expected, rtol=1e-12, atol=1e-12)
    jac = torch.func.jacrev(lambda t: f(t, offsets=ptr))(x).cpu().numpy()  # (4, 3, 12, 3)
    assert jac.shape == (4, 3, 12, 3)
    np.testing.assert_allclose(np.einsum("sfij,sf->ij", np.nan_to_num(jac), wn), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", FUNC_REDUCTIONS)
def test_vmap_reduces_the_batch_in_one_call(device, reduction, monkeypatch):
    """torch.vmap over a batch dimension (in front, or inside) is one call of linred with the batch
    as a leading dimension, and gives each element's float64 NumPy reduction."""
    from linred import _torch_ops

    rng = np.random.default_rng(6)
    xn = rng.standard_normal((5, 12, 3))
    ptr = torch.tensor(FUNC_OFFSETS, device=device)
    f = getattr(linred, f"segmented_{reduction}")
    expected = np.stack([_segment_reference(reduction, e, FUNC_OFFSETS) for e in xn])
    shapes = []
    call = _torch_ops._call
    monkeypatch.setattr(_torch_ops, "_call", lambda *a: shapes.append(tuple(a[1].shape)) or call(*a))
    got = torch.vmap(lambda t: f(t, offsets=ptr))(torch.tensor(xn, device=device))
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=1e-12)
    assert shapes == [(5, 12, 3)]
    # The batch inside the data: in_dims=1 (each element 12 x 3 again)
    inner = torch.tensor(np.ascontiguousarray(xn.transpose(1, 0, 2)), device=device)  # (12, 5, 3)
    got = torch.vmap(lambda t: f(t, offsets=ptr), in_dims=1)(inner)
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_vmap_with_offsets_batched_too(device):
    """Offsets that differ across the batch: each element reduced over its own segments."""
    rng = np.random.default_rng(7)
    xn = rng.standard_normal((3, 10))
    offs = [[0, 4, 10], [0, 0, 10], [0, 9, 10]]
    got = torch.vmap(lambda t, o: linred.segmented_sum(t, offsets=o))(
        torch.tensor(xn, device=device), torch.tensor(offs, device=device)
    )
    expected = [[xn[b, a:e].sum() for a, e in itertools.pairwise(o)] for b, o in enumerate(offs)]
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ("sum", "max"))
def test_per_sample_gradients(device, reduction):
    """vmap(grad(...)): each element's gradient, as float64 NumPy computes it alone."""
    rng = np.random.default_rng(8)
    xn, wn = rng.standard_normal((4, 12, 3)), rng.standard_normal((4, 3))
    ptr = torch.tensor(FUNC_OFFSETS, device=device)
    w = torch.tensor(wn, device=device)
    f = getattr(linred, f"segmented_{reduction}")

    def loss(t):
        y = f(t, offsets=ptr)
        return (torch.where(torch.isfinite(y), y, 0) * w).sum()

    got = torch.vmap(torch.func.grad(loss))(torch.tensor(xn, device=device)).cpu().numpy()
    expected = np.stack([_gradient_reference(reduction, e, FUNC_OFFSETS, wn) for e in xn])
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_hessian_by_jacrev_of_jacrev(device):
    """The Hessian of sum((S x)^2), S the segments' indicator, is 2 S^T S."""
    x = torch.tensor(np.random.default_rng(9).standard_normal(12), device=device)
    ptr = torch.tensor(FUNC_OFFSETS, device=device)
    H = torch.func.jacrev(torch.func.jacrev(lambda t: (linred.segmented_sum(t, offsets=ptr) ** 2).sum()))(x)
    S = np.zeros((4, 12))
    for s, (a, b) in enumerate(itertools.pairwise(FUNC_OFFSETS)):
        S[s, a:b] = 1
    np.testing.assert_allclose(H.cpu().numpy(), 2 * S.T @ S, rtol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_vmap_of_the_fused_and_arg_functions(device):
    """softmax, logsumexp, var and argmax under vmap, against float64 NumPy per element."""
    rng = np.random.default_rng(10)
    xn = rng.standard_normal((3, 12))
    x = torch.tensor(xn, device=device)
    ptr = torch.tensor(FUNC_OFFSETS, device=device)
    segs = [(a, b) for a, b in itertools.pairwise(FUNC_OFFSETS)]

    def softmax(v):
        parts = [np.exp(v[a:b] - v[a:b].max()) for a, b in segs if b > a]
        return np.concatenate([p / p.sum() for p in parts])

    got = torch.vmap(lambda t: linred.segmented_softmax(t, offsets=ptr))(x).cpu().numpy()
    np.testing.assert_allclose(got, np.stack([softmax(v) for v in xn]), rtol=1e-12)
    got = torch.vmap(lambda t: linred.segmented_logsumexp(t, offsets=ptr))(x).cpu().numpy()
    lse = [[np.log(np.exp(v[a:b]).sum()) if b > a else -np.inf for a, b in segs] for v in xn]
    np.testing.assert_allclose(got, lse, rtol=1e-12)
    got = torch.vmap(lambda t: linred.segmented_var(t, offsets=ptr))(x).cpu().numpy()
    var = [[v[a:b].var() if b > a else np.nan for a, b in segs] for v in xn]
    np.testing.assert_allclose(got, var, rtol=1e-12)
    got = torch.vmap(lambda t: linred.segmented_argmax(t, offsets=ptr))(x).cpu().numpy()
    arg = [[a + int(np.argmax(v[a:b])) if b > a else 12 for a, b in segs] for v in xn]
    np.testing.assert_array_equal(got, arg)


def test_out_is_refused_inside_torch_func():
    with pytest.raises(TypeError, match=r"torch\.func"):
        torch.vmap(lambda t: linred.segmented_sum(t, 2, out=torch.empty(2)))(torch.ones(3, 4))


@pytest.mark.parametrize("device", DEVICES)
def test_vmap_of_argmax_over_wide_rows(device):
    """Wide rows, where the arg-reductions otherwise take a kernel (GPU) or a loop over
    segments (host): under vmap they take the composition, with NumPy's first maxima."""
    rng = np.random.default_rng(11)
    xn = rng.integers(0, 3, (2, 4096, 32)).astype(np.float32)  # ties everywhere
    offsets = [0, 1000, 1000, 4096]
    got = torch.vmap(lambda t: linred.segmented_argmax(t, offsets=torch.tensor(offsets, device=device)))(
        torch.tensor(xn, device=device)
    )
    expected = [[a + np.argmax(e[a:b], axis=0) if b > a else np.full(32, 4096) for a, b in itertools.pairwise(offsets)]
                for e in xn]  # fmt: skip
    np.testing.assert_array_equal(got.cpu().numpy(), np.array(expected))


def test_a_plan_refuses_a_tensor_that_requires_grad():
    """A plan records no gradient: a tensor that requires grad is refused in grad mode (it came
    back with no grad_fn before), served under no_grad and detached, as the functions serve it."""
    x = torch.arange(12.0, dtype=torch.float64)
    plan = linred.SegmentedReduction(x, 3)
    y = x.clone().requires_grad_()
    with pytest.raises(TypeError, match="requires grad"):
        plan(y)
    with torch.no_grad():
        np.testing.assert_array_equal(plan(y).numpy(), [3.0, 12.0, 21.0, 30.0])
    np.testing.assert_array_equal(plan(y.detach()).numpy(), [3.0, 12.0, 21.0, 30.0])
    assert linred.segmented_sum(y, 3).grad_fn is not None


def test_torch_func_edge_cases():
    """Inside vmap: an element's axis out of range (or a bool) and 0-d elements raise as without
    vmap; an empty batch with batched offsets or lengths gives an empty result; a plan refuses
    torch.func's tensors by name; autograd's own batched backward (jacobian(vectorize=True))
    takes max and min."""
    from numpy.exceptions import AxisError

    with pytest.raises(AxisError):
        torch.vmap(lambda t: linred.segmented_sum(t, 2, axis=3))(torch.randn(4, 6))
    with pytest.raises(AxisError):
        torch.vmap(lambda t: linred.segmented_sum(t, 2, axis=-2))(torch.randn(4, 6))
    with pytest.raises(TypeError, match="axis must be an integer; got bool"):
        torch.vmap(lambda t: linred.segmented_sum(t, 2, axis=True))(torch.randn(4, 6))
    with pytest.raises(ValueError, match="at least one dimension"):
        torch.vmap(lambda t: linred.segmented_sum(t, 1))(torch.randn(4))
    x = torch.randn(6, dtype=torch.float64)
    empty = torch.vmap(lambda o: linred.segmented_sum(x, offsets=o))(torch.zeros(0, 3, dtype=torch.long))
    assert empty.shape == (0, 2)
    empty = torch.vmap(lambda t, ln: linred.segmented_mean(t, lengths=ln, axis=1))(
        torch.zeros(0, 2, 6), torch.zeros(0, 3, dtype=torch.long)
    )
    assert empty.shape == (0, 2, 3)
    plan = linred.SegmentedReduction(torch.zeros(6, dtype=torch.float64), 2)
    with pytest.raises(TypeError, match=r"x is a torch\.func tensor"):
        torch.vmap(plan)(torch.zeros(3, 6, dtype=torch.float64))
    y = torch.tensor(np.random.default_rng(12).standard_normal((12, 3)))
    ptr = torch.tensor(FUNC_OFFSETS)
    for reduction in FUNC_REDUCTIONS:
        f = getattr(linred, f"segmented_{reduction}")
        fast = torch.autograd.functional.jacobian(lambda t, f=f: f(t, offsets=ptr), y, vectorize=True)
        slow = torch.autograd.functional.jacobian(lambda t, f=f: f(t, offsets=ptr), y)
        np.testing.assert_allclose(fast.nan_to_num().numpy(), slow.nan_to_num().numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("function", ["sum", "mean", "max", "softmax", "log_softmax", "logsumexp", "var", "std"])
def test_jacobian_vectorized_on_cuda(function):
    """autograd's own batched backward of CUDA feature rows, where the backward otherwise takes
    torch.segment_reduce's backward kernel or linred's: the Jacobian row by row."""
    y = torch.tensor(np.random.default_rng(13).standard_normal((12, 3)), device="cuda")
    ptr = torch.tensor(FUNC_OFFSETS, device="cuda")
    f = getattr(linred, f"segmented_{function}")
    fast = torch.autograd.functional.jacobian(lambda t: f(t, offsets=ptr), y, vectorize=True)
    slow = torch.autograd.functional.jacobian(lambda t: f(t, offsets=ptr), y)
    np.testing.assert_allclose(fast.nan_to_num().cpu().numpy(), slow.nan_to_num().cpu().numpy(), rtol=1e-12,
                               atol=1e-12)  # fmt: skip


@pytest.mark.parametrize("function", ["softmax", "logsumexp", "var", "argmax"])
@pytest.mark.parametrize("spec", ["offsets", "lengths"])
def test_vmap_of_the_fused_and_arg_functions_with_batched_segments(function, spec):
    """Each element with its own segments (batched offsets or lengths), for the functions that
    run as compositions: as the same function called element by element."""
    segments = {"offsets": torch.tensor([[0, 2, 6], [0, 3, 6]]), "lengths": torch.tensor([[2, 4], [3, 3]])}[spec]
    f = getattr(linred, f"segmented_{function}")
    xb = torch.tensor(np.random.default_rng(13).standard_normal((2, 6)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (PyTorch's notes of batching rules it lacks: a slower loop)
        got = torch.vmap(lambda t, s: f(t, **{spec: s}))(xb, segments)
    expected = torch.stack([f(xb[i], **{spec: segments[i]}) for i in range(2)])
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs CUDA")
def test_checked_calls_under_a_cuda_default_device():
    """Under ``torch.set_default_device("cuda")`` (here ``with torch.device("cuda")``), a thread's
    first checked call allocates its pinned check word on the host (it raised "Only dense CPU
    tensors can be pinned"): a new thread, so that its word is made inside the block."""
    import threading

    rng = np.random.default_rng(14)
    xn = rng.standard_normal((12, 3))
    got: dict = {}

    def work():
        try:
            with torch.device("cuda"):
                got["sum"] = linred.segmented_sum(torch.tensor(xn), offsets=torch.tensor(FUNC_OFFSETS)).cpu()
                got["max"] = linred.segmented_max(torch.tensor(xn), lengths=[2, 0, 5, 5]).cpu()
        except Exception as e:  # (reported by the test's thread)
            got["error"] = e

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert "error" not in got, got.get("error")
    np.testing.assert_allclose(got["sum"].numpy(), _segment_reference("sum", xn, FUNC_OFFSETS), rtol=1e-12)
    np.testing.assert_array_equal(got["max"].numpy(), _segment_reference("max", xn, FUNC_OFFSETS))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", FUNC_REDUCTIONS)
def test_vjp_pullback_called_after_vjp_returns(device, reduction):
    """torch.func.vjp's pullback runs outside the transform, on the tensors the forward saved as
    torch.func wrappers: max, min and prod, whose backward reads them with linred's own paths,
    unwrap them (CUDA raised "Cannot access data pointer")."""
    rng = np.random.default_rng(15)
    xn, wn = rng.standard_normal((12, 3)), rng.standard_normal((4, 3))
    ptr = torch.tensor(FUNC_OFFSETS, device=device)
    f = getattr(linred, f"segmented_{reduction}")
    out, pull = torch.func.vjp(lambda t: f(t, offsets=ptr), torch.tensor(xn, device=device))
    w = torch.where(torch.isfinite(out), torch.tensor(wn, device=device), 0)
    got = pull(w)[0].cpu().numpy()
    expected = _gradient_reference(reduction, xn, FUNC_OFFSETS, np.where(np.isfinite(out.cpu().numpy()), wn, 0))
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


_IDS = {"sorted": [0, 0, 1, 1, 1, 2, 2, 4, 4], "unsorted": [2, 0, 1, 4, 1, 2, 0, 4, 1]}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["sum", "max", "argmax", "softmax", "var", "logsumexp"])
@pytest.mark.parametrize("order", list(_IDS))
@pytest.mark.parametrize("check", [True, False])
def test_compile_fullgraph_with_segment_ids(device, name, order, check):
    """Segment ids inside torch.compile(fullgraph=True): no value is read back (a graph break),
    the results and gradients are the eager ones, ids outside [0, num_segments) raise with
    check=True (the ValueError eager calls raise, naming the first such id) and are dropped with
    check=False."""
    ids = torch.tensor(_IDS[order], device=device)
    f = getattr(linred, f"segmented_{name}")
    kw = {"segment_ids": ids, "num_segments": 5, "check": check}
    x = torch.randn(9, 3, dtype=torch.float64, device=device, requires_grad=name != "argmax")
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: f(t, **kw), fullgraph=True, backend="aot_eager")
    got, want = compiled(x), f(x, **kw)
    torch.testing.assert_close(got, want, equal_nan=True)
    if name != "argmax":
        (g1,) = torch.autograd.grad(got.square().sum(), x)
        (g2,) = torch.autograd.grad(want.square().sum(), x)
        torch.testing.assert_close(g1, g2, equal_nan=True)
    outside = torch.tensor([0, 0, 1, 1, 7, 2, 2, -1, 4], device=device)
    kw["segment_ids"] = outside
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: f(t, **kw), fullgraph=True, backend="aot_eager")
    if check:
        with pytest.raises(
            ValueError, match=r"segment_ids must lie in \[0, num_segments\) = \[0, 5\); segment_ids\[4\] = 7"
        ):
            compiled(x.detach())
        with pytest.raises(ValueError, match=r"segment_ids\[4\] = 7"):
            f(x.detach(), **kw)
    else:
        torch.testing.assert_close(compiled(x.detach()), f(x.detach(), **kw), equal_nan=True)


def test_compile_with_segment_ids_needs_num_segments():
    f = torch.compile(lambda t: linred.segmented_sum(t, segment_ids=torch.tensor([0, 1, 1])), fullgraph=True)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"inside torch.compile, segment_ids needs num_segments"):
        f(torch.ones(3))


@pytest.mark.parametrize("name", ["sum", "argmax", "softmax", "log_softmax", "logsumexp", "var", "std"])
def test_compile_fullgraph_of_a_vmap(name):
    """torch.compile of a vmap of every kind of function (the compositions too) is one graph."""
    f = getattr(linred, f"segmented_{name}")
    x = torch.randn(3, 10, dtype=torch.float64)
    offsets = torch.tensor([0, 3, 3, 10])
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: torch.func.vmap(lambda u: f(u, offsets=offsets))(t), fullgraph=True,
                             backend="eager")  # fmt: skip
    torch.testing.assert_close(compiled(x), torch.stack([f(row, offsets=offsets) for row in x]), equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_prod_gradient_of_the_one_zero_in_the_result_dtype(device):
    """With dtype=float64 of float32 data, the derivative of a segment's one zero (the product of
    its other elements) is computed in float64 as the result is: float32 rounds it once."""
    rng = np.random.default_rng(1)
    v = (np.sign(rng.standard_normal((8, 64))) * np.exp(0.3 * rng.standard_normal((8, 64)))).astype(np.float32)
    v[:, 5] = 0
    x = torch.tensor(v.reshape(-1), device=device, requires_grad=True)
    (g,) = torch.autograd.grad(linred.segmented_prod(x, 64, dtype=torch.float64).sum(), x)
    others = np.prod(np.delete(v.astype(np.float64), 5, axis=1), axis=1).astype(np.float32)
    np.testing.assert_array_equal(g.reshape(8, 64)[:, 5].cpu().numpy(), others)


def test_compile_with_segment_ids_matches_eager_at_its_edges():
    """Inside torch.compile(fullgraph=True) with segment ids: a vmap of a call (the ids shared),
    out= refused as the operator refuses it, a product's dropped elements pass a gradient of 0 (not NaN where the
    product overflows), and a wrong ids_sorted promise on CPU ids counts for nothing, as eagerly
    (host ids are read there)."""
    ids = torch.tensor([0, 0, 2, 2, 1, 1, 1, 0, 2, 2])
    x = torch.randn(3, 10, dtype=torch.float64)
    for name in ("sum", "argmax", "softmax"):
        f = getattr(linred, f"segmented_{name}")
        g = torch.compile(lambda t, f=f: torch.func.vmap(lambda u: f(u, segment_ids=ids, num_segments=3))(t),
                          fullgraph=True, backend="eager")  # fmt: skip
        torch._dynamo.reset()
        torch.testing.assert_close(g(x), torch.stack([f(row, segment_ids=ids, num_segments=3) for row in x]))
    for check in (True, False):
        for bad in (torch.empty(3, dtype=torch.int64), torch.empty(2, 3)):
            torch._dynamo.reset()

            def call(t, o, c=check):
                return linred.segmented_sum(t, segment_ids=ids, num_segments=3, out=o, check=c)

            g = torch.compile(call, fullgraph=True, backend="eager")
            with pytest.raises(Exception, match=r"out= and stream= are not supported inside torch.compile"):
                g(torch.ones(10), bad)
    dropped = torch.tensor([0, 0, 5, 1, 5, 1])
    x = torch.tensor([1.0, 3.0, 1e200, 4.0, 1e200, 5.0], dtype=torch.float64, requires_grad=True)
    torch._dynamo.reset()
    g = torch.compile(lambda t: linred.segmented_prod(t, segment_ids=dropped, num_segments=2, check=False).sum(),
                      fullgraph=True, backend="aot_eager")  # fmt: skip
    (grad,) = torch.autograd.grad(g(x), x)
    torch.testing.assert_close(grad, torch.tensor([3.0, 1.0, 0.0, 5.0, 0.0, 4.0], dtype=torch.float64))
    unsorted = torch.tensor([1, 0, 1, 0])
    kw = {"segment_ids": unsorted, "num_segments": 2, "ids_sorted": True, "check": False}
    torch._dynamo.reset()
    g = torch.compile(lambda t: linred.segmented_sum(t, **kw), fullgraph=True, backend="eager")
    torch.testing.assert_close(g(torch.arange(1.0, 5.0)), linred.segmented_sum(torch.arange(1.0, 5.0), **kw))


def test_compile_refuses_out_and_stream_with_ids_as_with_offsets():
    """Inside torch.compile, out= (also of a tensor that requires grad) and stream= are refused
    with ids as the operator refuses them with offsets: one message, whichever spec names the
    segments."""
    ids = torch.tensor([0, 0, 1, 1, 2, 2])
    offsets = torch.tensor([0, 2, 4, 6])
    x = torch.randn(6, requires_grad=True)
    for extra in ({"out": torch.empty(3)}, {"stream": 0}):
        for spec in ({"segment_ids": ids, "num_segments": 3}, {"offsets": offsets}):
            torch._dynamo.reset()
            g = torch.compile(lambda t, s=spec, e=extra: linred.segmented_sum(t, **s, **e), fullgraph=True,
                              backend="eager")  # fmt: skip
            with pytest.raises(Exception, match=r"out= and stream= are not supported inside torch.compile"):
                g(x)


@pytest.mark.parametrize("device", DEVICES)
def test_prod_gradient_with_an_infinity_or_a_nan_beside_the_one_zero(device):
    """In a segment with one zero, an infinite or NaN element's derivative is the product of the
    others, which holds the zero: 0 (others / x_j was inf / inf: NaN), as torch.prod's gradient
    gives; with two such elements NaN; the zero's own derivative and the other elements' as
    torch.prod gives them."""
    inf, nan = float("inf"), float("nan")
    segments = [[0.0, inf, 2.0], [nan, 0.0, 3.0], [0.0, inf, inf], [0.0, -inf, 5.0, 0.5], [2.0, 0.0, 4.0]]
    x = torch.tensor([v for s in segments for v in s], dtype=torch.float64, device=device, requires_grad=True)
    offsets = torch.tensor(np.cumsum([0] + [len(s) for s in segments]), device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        (got,) = torch.autograd.grad(linred.segmented_prod(x, offsets=offsets).sum(), x)
    want = []
    for s in segments:
        t = torch.tensor(s, dtype=torch.float64, requires_grad=True)
        want.append(torch.autograd.grad(torch.prod(t), t)[0])
    torch.testing.assert_close(got.cpu(), torch.cat(want), equal_nan=True)


@pytest.mark.parametrize("name", ["var", "std", "logsumexp", "softmax", "log_softmax", "argmax", "argmin", "sum"])
def test_compile_with_remainder_keep(name):
    """torch.compile(fullgraph=True) of a call with remainder="keep" (the lengths made from the
    length, with the last segment the remainder): the eager call's values."""
    f = getattr(linred, f"segmented_{name}")
    x = torch.tensor([1.0, 2.0, 3.0, 5.0, 8.0], dtype=torch.float64)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: f(t, 2, remainder="keep"), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), f(x, 2, remainder="keep"), equal_nan=True)


# --- segment arguments of other kinds, alike with and without autograd (found by a review) ---


def _segment_forms():
    """(label, keyword, value, refusal): host segment arguments PyTorch does not take as they
    are (another byte order, negative strides, objects, read-only) and ones linred refuses by
    name (integers past int64); each read as a tensor's would be."""
    readonly = np.array([0, 3, 8])
    readonly.flags.writeable = False
    return [
        ("big-endian offsets", "offsets", np.array([0, 3, 8], dtype=">i8"), None),
        ("negative-stride lengths", "lengths", np.array([5, 3])[::-1], None),
        ("object offsets", "offsets", np.array([0, 3, 8], dtype=object), None),
        ("read-only offsets", "offsets", readonly, None),
        ("list past int64", "offsets", [0, 2**63, 8], "offsets must fit in int64; got 9223372036854775808"),
    ]


@pytest.mark.parametrize("reduction", ["sum", "max", "prod", "softmax", "argmax", "var"])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_segment_arguments_are_read_alike_with_and_without_grad(reduction, requires_grad):
    """The same offsets or lengths give the same result (or the same refusal) whether x requires
    grad or not; PyTorch prints no warning about them (a read-only array is copied)."""
    values = np.arange(8, dtype=np.float64) + 1
    fn = getattr(linred, f"segmented_{reduction}")
    want = fn(values, offsets=np.array([0, 3, 8]))
    for label, keyword, value, refusal in _segment_forms():
        x = torch.tensor(values, requires_grad=requires_grad and reduction != "argmax")
        if refusal is not None:
            with pytest.raises(ValueError, match=re.escape(refusal)):
                fn(x, **{keyword: value})
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = fn(x, **{keyword: value})
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-12, err_msg=label)


def test_dask_offsets_are_refused_by_name_with_grad():
    """A Dask array of offsets for a tensor that requires grad is refused as without grad (it
    was made a tensor of its graph's chunks)."""
    da = pytest.importorskip("dask.array")
    offsets = da.from_array(np.array([0, 3, 8]))
    for requires_grad in (False, True):
        x = torch.arange(8.0, requires_grad=requires_grad)
        with pytest.raises(TypeError, match="offsets is a Dask array but x is not"):
            linred.segmented_sum(x, offsets=offsets)


def test_negative_stride_segment_ids_for_tensors():
    """NumPy segment ids with negative strides for a tensor: read (as NumPy data's are)."""
    ids = np.array([2, 2, 1, 0, 0])[::-1]
    x = torch.arange(5.0)
    np.testing.assert_array_equal(linred.segmented_sum(x, segment_ids=ids).numpy(), [1.0, 2.0, 7.0])


@pytest.mark.parametrize("reduction", ["argmax", "softmax", "var"])
@pytest.mark.parametrize("form", ["offsets list", "lengths list", "offsets numpy", "ids list"])
def test_compile_fullgraph_with_host_segment_arguments(reduction, form):
    """torch.compile(fullgraph=True) traces calls whose segments are a list or a NumPy array
    (constants of the traced function) for every function, as eagerly: no graph break."""
    kwargs = {
        "offsets list": {"offsets": [0, 2, 3, 7]},
        "lengths list": {"lengths": [2, 1, 4]},
        "offsets numpy": {"offsets": np.array([0, 2, 3, 7])},
        "ids list": {"segment_ids": [0, 0, 1, 2, 2, 2, 2], "num_segments": 3},
    }[form]
    fn = getattr(linred, f"segmented_{reduction}")
    x = torch.randn(7, 3, dtype=torch.float64)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: fn(t, **kwargs), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), fn(x, **kwargs))


def test_prod_gradient_beside_one_zero_does_not_overflow_to_nan():
    """A segment with one zero: the gradient of every other element is 0 even where the product
    of the rest divided by a tiny element passes the float64 range (it was 0 * inf = NaN)."""
    for values in ([1e-300, 1e200, 1e200, 0.0], [1e-200, 1.05, 1e200, -1.72, 1e200, -3.0, 0.0]):
        x = torch.tensor(values, dtype=torch.float64, requires_grad=True)
        linred.segmented_prod(x, len(values)).sum().backward()
        y = torch.tensor(values, dtype=torch.float64, requires_grad=True)
        torch.prod(y).backward()
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-12, atol=0)


@pytest.mark.parametrize("reduction", ["var", "std", "sum", "softmax"])
def test_vmap_over_an_empty_batch_with_batched_offsets(reduction):
    """vmap over a batch of no examples, offsets batched too: an empty result of the right shape."""
    x, offsets = torch.randn(0, 7), torch.zeros(0, 4, dtype=torch.long)
    fn = getattr(linred, f"segmented_{reduction}")
    try:
        got = torch.func.vmap(lambda a, b: fn(a, offsets=b))(x, offsets)
    except RuntimeError as e:  # (PyTorch 2.13 has no rule for the composition's repeat_interleave there)
        if "Batching rule not implemented for aten::repeat_interleave" not in str(e) or reduction == "sum":
            raise
        pytest.skip(f"PyTorch {torch.__version__} cannot vmap repeat_interleave over an empty batch")
    assert tuple(got.shape) == ((0, 7) if reduction == "softmax" else (0, 3))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"segment_length": 3}, "does not divide the length of axis 1 (n=10)"),
        ({"lengths": [4, 4]}, "lengths must sum to the length of axis 1 (n=10); got 8"),
        ({"offsets": [0, 4, 9]}, "axis 1"),
    ],
)
def test_vmap_messages_name_the_elements_axis(kwargs, message):
    """Under vmap a refused call names the axis the caller gave (the element's), as without
    vmap, not the batched tensor's (one further)."""
    batch = torch.randn(4, 3, 10)
    with pytest.raises(ValueError, match=re.escape(message)) as without:
        linred.segmented_sum(batch[0], axis=1, **kwargs)
    with pytest.raises(ValueError) as inside:
        torch.func.vmap(lambda e: linred.segmented_sum(e, axis=1, **kwargs))(batch)
    assert str(inside.value) == str(without.value)


@pytest.mark.parametrize("form", ["ids", "softmax offsets", "argmax offsets", "numpy offsets"])
def test_compile_fullgraph_with_uint64_segment_arguments(form):
    """uint64 segment arguments (a CPU tensor or a NumPy array) trace under torch.compile(
    fullgraph=True) and give the eager result: the refusal of values past int64 reads them,
    which a trace cannot, and stays out of it (found by a review)."""
    if not hasattr(torch, "uint64"):
        pytest.skip("this PyTorch has no uint64")
    x = torch.arange(6.0, dtype=torch.float64)
    offsets_t = torch.tensor([0, 3, 6], dtype=torch.uint64)
    ids = torch.tensor([1, 0, 0, 1, 1, 1], dtype=torch.uint64)
    call = {
        "ids": lambda t: linred.segmented_sum(t, segment_ids=ids, num_segments=2, check=False),
        "softmax offsets": lambda t: linred.segmented_softmax(t, offsets=offsets_t),
        "argmax offsets": lambda t: linred.segmented_argmax(t, offsets=offsets_t),
        "numpy offsets": lambda t: linred.segmented_sum(t, offsets=np.array([0, 3, 6], np.uint64)),
    }[form]
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(call, fullgraph=True, backend="eager")(x), call(x))


@pytest.mark.parametrize("reduction", ["sum", "max", "softmax", "var"])
def test_torch_func_grad_with_segment_ids(reduction):
    """torch.func.grad, vjp and vmap(grad) through a call with segment ids on CPU tensors: the
    gradients autograd gives (the ids' summary read through NumPy must leave a transform's
    tensors, which have no storage of their own, to torch; found by a fuzzer)."""
    fn = getattr(linred, f"segmented_{reduction}")
    ids = torch.tensor([0, 0, 1, 1, 2])
    weights = torch.arange(1.0, 6.0, dtype=torch.float64)

    def loss(x):
        y = fn(x, segment_ids=ids, num_segments=3)
        return (y * weights[: y.shape[0]]).sum()

    x = torch.tensor([0.3, -1.2, 2.5, 0.7, -0.4], dtype=torch.float64, requires_grad=True)
    (want,) = torch.autograd.grad(loss(x), x)
    torch.testing.assert_close(torch.func.grad(loss)(x.detach()), want)
    batch = torch.stack([x.detach(), 2 * x.detach()])
    got = torch.func.vmap(torch.func.grad(loss))(batch)
    torch.testing.assert_close(got[0], want)


def test_one_element_negative_stride_segment_arguments():
    """A one-element NumPy array with a negative stride (NumPy calls it contiguous) is copied for
    a tensor like any negative-stride array (found by a fuzzer)."""
    x = torch.tensor([3.0])
    np.testing.assert_array_equal(linred.segmented_sum(x, segment_ids=np.array([0])[::-1]).numpy(), [3.0])
    xg = torch.tensor([3.0], requires_grad=True)
    np.testing.assert_array_equal(linred.segmented_sum(xg, lengths=np.array([1])[::-1]).detach().numpy(), [3.0])


def test_unaligned_complex_tensors_through_autograd_and_the_compositions():
    """Complex128 CPU tensors over unaligned memory (torch.from_numpy of an unaligned NumPy view),
    requiring grad, through the functions whose forward or backward runs PyTorch's operations
    (var and std compose a broadcast subtraction; the product's backward divides), with a
    conjugate bit too: the values and gradients of the same data aligned (PyTorch's CPU kernels of
    such data, its copy included, end the process: the calls run in a subprocess)."""
    from support.scripts import run_script

    run_script(
        """
            import numpy as np, torch, linred

            def unaligned(values):
                values = np.asarray(values, np.complex128)
                buf = np.zeros(values.size * 16 + 1, np.uint8)
                a = buf[1:].view(np.complex128).reshape(values.shape)
                a[...] = values
                t = torch.from_numpy(a)
                assert t.data_ptr() % 16 != 0
                return t

            rng = np.random.default_rng(0)
            values = rng.standard_normal((6, 3)) + 1j * rng.standard_normal((6, 3))
            calls = [
                lambda x: linred.segmented_var(x, 2).abs(),
                lambda x: linred.segmented_std(x, offsets=[0, 1, 6]),
                lambda x: linred.segmented_prod(x, offsets=[0, 2, 6]).abs(),
                lambda x: linred.segmented_prod(x, 3).abs(),
                lambda x: linred.segmented_sum(x, lengths=[4, 2]).abs(),
                lambda x: linred.segmented_mean(x.conj(), 3).abs(),
            ]
            for k, call in enumerate(calls):
                x = unaligned(values).requires_grad_(True)
                ref = torch.from_numpy(values.copy()).requires_grad_(True)
                got, want = call(x), call(ref)
                torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
                g, = torch.autograd.grad(got.sum(), x)
                w, = torch.autograd.grad(want.sum(), ref)
                torch.testing.assert_close(g, w, rtol=1e-12, atol=0, msg=str(k))
            print("ok")
        """
    )


@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 0, 3), (1, 5), (3, 1, 7, 2), [4, 6], 7, np.int64(3)], ids=repr)
def test_torch_allocations_are_torch_empty_layouts(shape):
    """The torch adapter's allocations (torch.empty_strided with the contiguous strides looked up)
    give the shape, strides, dtype and device torch.empty gives, for tuples, torch.Size, lists,
    ints and NumPy integers, through the plans' allocator and the adapter's empty alike."""
    torch = pytest.importorskip("torch")
    from linred.arrays import _torch as torch_arrays

    adapter = torch_arrays.TorchAdapter()
    want = torch.empty(shape if not isinstance(shape, np.integer) else int(shape), dtype=torch.float32)
    for got in (
        adapter.empty(shape, "float32", None),
        adapter.allocator("float32", None)(shape),
        adapter.allocator("float32", None)(torch.Size(want.shape)),
    ):
        assert (got.shape, got.stride(), got.dtype, got.device) == (want.shape, want.stride(), want.dtype, want.device)
        assert got.is_contiguous()
    many = adapter.allocator("int64", None)
    for k in range(300):  # (the strides' table is emptied when full: the layouts stay right)
        got = many((2, k, 3))
        assert got.stride() == torch.empty((2, k, 3)).stride()
    assert len(torch_arrays._strides) <= 256
