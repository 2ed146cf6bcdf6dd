"""``segment_ids=``: segments named by one id per element, sorted (a ``batch`` vector) or not.

Every result is compared with a float64 NumPy reference that gathers each segment's elements
by a boolean mask, on every array kind (the GPU kinds where there is a GPU), along either
axis with feature dims, for every reduction and the arg-reductions."""

from __future__ import annotations

import numpy as np
import pytest
from support import to_kind, to_numpy
from support.arrays import HOST_KINDS
from support.calls import count_calls

import linred

REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}
IDENTITY = {"sum": 0.0, "mean": np.nan, "max": -np.inf, "min": np.inf}


def _reference(reduction: str, x: np.ndarray, ids: np.ndarray, m: int, axis: int) -> np.ndarray:
    """Segment ``i`` = the elements with id ``i`` (ids outside [0, m) belong to none)."""
    parts = []
    for i in range(m):
        part = np.compress(ids == i, x, axis=axis)
        if part.shape[axis]:
            parts.append(REDUCE[reduction](part, axis=axis))
        else:
            shape = list(x.shape)
            del shape[axis]
            parts.append(np.full(shape, IDENTITY[reduction]))
    return np.stack(parts, axis=axis)


def _arg_reference(which: str, x: np.ndarray, ids: np.ndarray, m: int) -> np.ndarray:
    """First position in ``x`` attaining the segment's extreme; ``n`` for an empty segment (1-D)."""
    out = np.full(m, x.shape[0], dtype=np.int64)
    for i in range(m):
        where = np.flatnonzero(ids == i)
        if where.size:
            values = x[where]
            out[i] = where[np.argmax(values) if which == "max" else np.argmin(values)]
    return out


def _ids(rng: np.random.Generator, n: int, m: int, order: str) -> np.ndarray:
    ids = rng.integers(0, max(m, 1), size=n) if m else np.zeros(n, dtype=np.int64)
    return np.sort(ids) if order == "sorted" else ids


@pytest.mark.parametrize("reduction", list(REDUCE))
@pytest.mark.parametrize("order", ["sorted", "unsorted"])
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("n, m", [(1, 1), (12, 4), (37, 5), (300, 40), (64, 200)])
def test_ids_against_numpy(array_kind, reduction, order, axis, n, m):
    rng = np.random.default_rng(n * 1000 + m)
    x = rng.standard_normal((n, 3) if axis == 0 else (2, n))
    ids = _ids(rng, n, m, order)
    fn = getattr(linred, f"segmented_{reduction}")
    expected = _reference(reduction, x, ids, m, axis)
    got = fn(to_kind(x, array_kind), segment_ids=to_kind(ids, array_kind), num_segments=m, axis=axis)
    assert type(got) is type(to_kind(x, array_kind))
    np.testing.assert_allclose(to_numpy(got), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("order", ["sorted", "unsorted"])
def test_num_segments_defaults_to_the_largest_id_plus_one(array_kind, order):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(50)
    ids = _ids(rng, 50, 6, order)
    ids[ids == 5] = 4  # the largest id is 4: five segments
    got = to_numpy(linred.segmented_sum(to_kind(x, array_kind), segment_ids=to_kind(ids, array_kind)))
    np.testing.assert_allclose(got, _reference("sum", x, ids, 5, 0), rtol=1e-12)


@pytest.mark.parametrize("order", ["sorted", "unsorted"])
def test_arg_reductions_give_positions_in_x(array_kind, order):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 4, size=40).astype(np.float64)  # many ties: the first occurrence wins
    ids = _ids(rng, 40, 7, order)
    ids[ids == 2] = 3  # segment 2 is empty: its position is n
    for which in ("max", "min"):
        fn = getattr(linred, f"segmented_arg{which}")
        got = fn(to_kind(x, array_kind), segment_ids=to_kind(ids, array_kind), num_segments=7)
        np.testing.assert_array_equal(to_numpy(got), _arg_reference(which, x, ids, 7))


@pytest.mark.parametrize("order", ["sorted", "unsorted"])
@pytest.mark.parametrize("sorted_promise", [None, True])
def test_check_false_drops_ids_outside_the_range(array_kind, order, sorted_promise):
    """As ``jax.ops.segment_sum`` does: ids < 0 or >= num_segments belong to no segment."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal(60)
    ids = rng.integers(-3, 9, size=60)
    if order == "sorted" or sorted_promise:
        ids = np.sort(ids)
    got = linred.segmented_sum(to_kind(x, array_kind), segment_ids=to_kind(ids, array_kind), num_segments=6,
                               check=False, ids_sorted=sorted_promise)  # fmt: skip
    np.testing.assert_allclose(to_numpy(got), _reference("sum", x, ids, 6, 0), rtol=1e-12)
    got = linred.segmented_mean(to_kind(x, array_kind), segment_ids=to_kind(ids, array_kind), num_segments=6,
                                check=False)  # fmt: skip
    np.testing.assert_allclose(to_numpy(got), _reference("mean", x, ids, 6, 0), rtol=1e-12)


def test_uint64_ids_past_int64_are_dropped_unchecked_and_named_checked():
    """NumPy uint64 ids of 2^63 or more are outside any range of segments: dropped with
    check=False (as device ids, which wrap to negative ones, are), named by check=True."""
    x = np.arange(6.0)
    ids = np.array([1, 2**64 - 1, 0, 1, 2**63, 1], np.uint64)
    kept = np.array([1, -1, 0, 1, -1, 1])
    for name in ("sum", "mean", "max"):
        got = getattr(linred, f"segmented_{name}")(x, segment_ids=ids, num_segments=2, check=False)
        np.testing.assert_array_equal(got, _reference(name, x, kept, 2, 0))
    got = linred.segmented_softmax(x, segment_ids=ids, num_segments=2, check=False)
    np.testing.assert_allclose(got, _composed_reference("softmax", x, kept, 2), rtol=1e-12)
    got = linred.segmented_sum(x, segment_ids=[int(i) for i in ids], num_segments=2, check=False)  # (a list)
    np.testing.assert_array_equal(got, _reference("sum", x, kept, 2, 0))
    with pytest.raises(ValueError, match="segment_ids must fit in int64; got 18446744073709551615"):
        linred.segmented_sum(x, segment_ids=ids, num_segments=2)
    # Without num_segments the largest id is the count of segments: such an id is named, not dropped.
    for name in ("sum", "softmax"):
        with pytest.raises(ValueError, match="segment_ids must fit in int64; got 18446744073709551615"):
            getattr(linred, f"segmented_{name}")(x, segment_ids=ids, check=False)


@pytest.mark.parametrize("order", ["<", ">"])
def test_uint64_ids_of_either_byte_order(array_kind, order):
    """uint64 ids past int64 are refused by value (or dropped with check=False and num_segments)
    in either byte order: big-endian ones were wrapped to negative ids (found by a fuzzer)."""
    if array_kind not in HOST_KINDS:
        pytest.skip("host ids")
    x = to_kind(np.arange(4.0), array_kind)
    ids = np.array([0, 2**63 + 5, 1, 1], dtype=f"{order}u8")
    with pytest.raises(ValueError, match="segment_ids must fit in int64; got 9223372036854775813"):
        linred.segmented_sum(x, segment_ids=ids)
    with pytest.raises(ValueError, match="segment_ids must fit in int64; got 9223372036854775813"):
        linred.segmented_sum(x, segment_ids=ids, check=False)
    got = linred.segmented_sum(x, segment_ids=ids, num_segments=2, check=False)
    np.testing.assert_array_equal(to_numpy(got), [0.0, 5.0])
    with pytest.raises(ValueError, match="lengths must fit in int64"):
        linred.segmented_sum(x, lengths=np.array([2**64 - 1, 1], dtype=f"{order}u8"))


def test_uint64_ids_past_int64_with_cpu_tensors():
    """The same rule for a CPU tensor's ids given as NumPy uint64, a list or a torch uint64
    tensor: dropped with check=False and num_segments, named otherwise (they were wrapped to
    negative ids: dropped silently without num_segments, named as negative ids when checked)."""
    torch = pytest.importorskip("torch")
    x = torch.arange(6.0, dtype=torch.float64)
    ids = np.array([1, 2**64 - 1, 0, 1, 2**63, 1], np.uint64)
    kept = np.array([1, -1, 0, 1, -1, 1])
    forms = {"numpy": ids, "list": [int(i) for i in ids]}
    if hasattr(torch, "uint64"):
        forms["torch"] = torch.from_numpy(ids)
    for form, given in forms.items():
        got = linred.segmented_sum(x, segment_ids=given, num_segments=2, check=False)
        np.testing.assert_array_equal(got.numpy(), _reference("sum", x.numpy(), kept, 2, 0), err_msg=form)
        for kwargs in ({"num_segments": 2}, {"check": False}, {}):
            with pytest.raises(ValueError, match="segment_ids must fit in int64; got 18446744073709551615"):
                linred.segmented_sum(x, segment_ids=given, **kwargs)


COMPOSED = ("logsumexp", "softmax", "log_softmax", "var", "std")


def _composed_reference(name: str, x: np.ndarray, ids: np.ndarray, m: int) -> np.ndarray:
    """float64, 1-D: per segment (logsumexp, var, std), or per element (the softmaxes; NaN for an
    element whose id names no segment)."""
    if name in ("softmax", "log_softmax"):
        out = np.full(x.shape, np.nan)
        for i in range(m):
            where = ids == i
            if where.any():
                seg = x[where]
                lse = seg.max() + np.log(np.exp(seg - seg.max()).sum())
                out[where] = np.exp(seg - lse) if name == "softmax" else seg - lse
        return out
    out = np.full(m, -np.inf if name == "logsumexp" else np.nan)
    for i in range(m):
        seg = x[ids == i]
        if seg.size:
            if name == "logsumexp":
                out[i] = seg.max() + np.log(np.exp(seg - seg.max()).sum())
            else:
                var = ((seg - seg.mean()) ** 2).mean()
                out[i] = np.sqrt(var) if name == "std" else var
    return out


@pytest.mark.parametrize("name", COMPOSED)
@pytest.mark.parametrize("order", ["sorted", "unsorted"])
@pytest.mark.parametrize("sorted_promise", [None, True])
def test_check_false_drops_ids_outside_the_range_in_the_composed_functions(array_kind, name, order,
                                                                            sorted_promise):  # fmt: skip
    """The composed functions drop them too: the named segments' values are those of their own
    elements, and an element of no segment gets NaN from softmax and log_softmax (an index
    error, or a negative id taken as the last segment, before)."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal(60)
    ids = rng.integers(-3, 9, size=60)
    if order == "sorted" or sorted_promise:
        ids = np.sort(ids)
    got = getattr(linred, f"segmented_{name}")(to_kind(x, array_kind), segment_ids=to_kind(ids, array_kind),
                                               num_segments=6, check=False, ids_sorted=sorted_promise)  # fmt: skip
    np.testing.assert_allclose(to_numpy(got), _composed_reference(name, x, ids, 6), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("function", ["sum", "argmax", "softmax", "var"])
def test_host_ids_are_read_whatever_ids_sorted_promises(array_kind, function):
    """Host ids (NumPy's, and a CPU tensor's) are always read: a wrong ``ids_sorted=True`` with
    ``check=False`` is found and the ids sorted (CPU tensors took it on trust for the
    reductions: [3, 7] instead of [6, 4]).  Device ids take the promise (not tested here)."""
    if array_kind not in HOST_KINDS:
        pytest.skip("device ids take ids_sorted on trust")
    x = np.array([1.0, 2.0, 3.0, 4.0])
    ids = np.array([1, 0, 1, 0])
    f = getattr(linred, f"segmented_{function}")
    got = to_numpy(f(to_kind(x, array_kind), segment_ids=to_kind(ids, array_kind), ids_sorted=True, check=False))
    if function == "sum":
        np.testing.assert_array_equal(got, [6.0, 4.0])
    elif function == "argmax":
        np.testing.assert_array_equal(got, [3, 2])
    elif function == "var":
        np.testing.assert_allclose(got, [1.0, 1.0], rtol=1e-12)
    else:
        np.testing.assert_allclose(got, _composed_reference("softmax", x, ids, 2), rtol=1e-12)


@pytest.mark.parametrize("function", ["sum", "argmax", "softmax", "logsumexp", "var"])
def test_the_ids_arguments_need_segment_ids(array_kind, function):
    """``num_segments`` or ``ids_sorted`` without ``segment_ids`` raise TypeError for every array
    kind (the GPU kernel of the softmax family ignored ``ids_sorted`` there)."""
    x = to_kind(np.arange(8.0), array_kind)
    f = getattr(linred, f"segmented_{function}")
    with pytest.raises(TypeError, match="ids_sorted applies to segment_ids only"):
        f(x, offsets=to_kind(np.array([0, 3, 8]), array_kind), ids_sorted=True)
    with pytest.raises(TypeError, match="num_segments applies to segment_ids only"):
        f(x, 4, num_segments=2)


def test_check_true_refuses_ids_outside_the_range(array_kind):
    x = to_kind(np.arange(6.0), array_kind)
    with pytest.raises(ValueError, match=r"\[0, 3\); segment_ids\[4\] = 3"):
        linred.segmented_sum(x, segment_ids=to_kind(np.array([0, 0, 1, 2, 3, 2]), array_kind), num_segments=3)
    with pytest.raises(ValueError, match=r"\[0, 4\); segment_ids\[1\] = -1"):
        linred.segmented_max(x, segment_ids=to_kind(np.array([0, -1, 1, 2, 3, 2]), array_kind), num_segments=4)


def test_out_dtype_and_feature_dims(array_kind):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 30, 4)).astype(np.float32)
    ids = rng.integers(0, 5, size=30)
    expected = _reference("sum", x.astype(np.float64), ids, 5, 1)
    out = to_kind(np.empty((2, 5, 4), dtype=np.float64), array_kind)
    got = linred.segmented_sum(to_kind(x, array_kind), segment_ids=to_kind(ids, array_kind), num_segments=5,
                               axis=1, dtype="float64", out=out)  # fmt: skip
    assert got is out
    np.testing.assert_allclose(to_numpy(got), expected, rtol=1e-12)
    # and with check=False (sentinel segments: the result is copied into out)
    out2 = to_kind(np.empty((2, 5, 4), dtype=np.float32), array_kind)
    got = linred.segmented_sum(to_kind(x, array_kind), segment_ids=to_kind(ids, array_kind), num_segments=5,
                               axis=1, out=out2, check=False)  # fmt: skip
    assert got is out2
    np.testing.assert_allclose(to_numpy(got), expected, rtol=1e-5)


def test_integer_data_and_empty_input():
    x = np.array([5, 1, 7, 3], dtype=np.int32)
    np.testing.assert_array_equal(linred.segmented_sum(x, segment_ids=[1, 0, 1, 1]), [1, 15])
    np.testing.assert_array_equal(linred.segmented_min(x, segment_ids=[1, 0, 1, 1]), [1, 3])
    empty = linred.segmented_sum(np.zeros(0), segment_ids=np.zeros(0, dtype=np.int64))
    assert empty.shape == (0,)
    np.testing.assert_array_equal(
        linred.segmented_sum(np.zeros(0), segment_ids=np.zeros(0, dtype=np.int64), num_segments=3), [0, 0, 0]
    )


def test_sum_keeps_the_order_of_each_segments_elements():
    """Deterministic: an unsorted segment is summed in x's order, not in an order atomics choose."""
    x = np.array([1e16, 3.0, 1.0, -1e16, 5.0], dtype=np.float64)
    ids = np.array([0, 1, 0, 0, 1])
    got = linred.segmented_sum(x, segment_ids=ids)
    expected = [((1e16 + 1.0) + -1e16), 8.0]  # left to right in x's order
    np.testing.assert_array_equal(got, expected)
    assert [linred.segmented_sum(x, segment_ids=ids)[0] for _ in range(5)] == [got[0]] * 5


def test_errors():
    x = np.arange(6.0)
    ids = np.array([0, 0, 1, 1, 2, 2])
    with pytest.raises(TypeError, match="give one of segment_length, offsets, lengths or segment_ids"):
        linred.segmented_sum(x, 2, segment_ids=ids)
    with pytest.raises(TypeError, match="segment_ids and offsets"):
        linred.segmented_sum(x, offsets=[0, 6], segment_ids=ids)
    with pytest.raises(TypeError, match="segment_ids and remainder"):
        linred.segmented_sum(x, segment_ids=ids, remainder="drop")
    with pytest.raises(TypeError, match="num_segments applies to segment_ids only"):
        linred.segmented_sum(x, 2, num_segments=3)
    for f in (linred.segmented_sum, linred.segmented_argmax, linred.segmented_softmax, linred.segmented_var):
        with pytest.raises(TypeError, match="ids_sorted applies to segment_ids only"):  # (was ignored)
            f(x, 2, ids_sorted=True)
    with pytest.raises(ValueError, match=r"one id per element along axis 0 \(6\); got 5"):
        linred.segmented_sum(x, segment_ids=ids[:5])
    with pytest.raises(ValueError, match="must be 1-D"):
        linred.segmented_sum(x, segment_ids=ids.reshape(2, 3))
    with pytest.raises(TypeError, match="segment_ids must be an array of integers; got dtype float64"):
        linred.segmented_sum(x, segment_ids=ids.astype(float))
    with pytest.raises(TypeError, match="segment_ids must be an array of integers; got dtype bool"):
        linred.segmented_sum(x, segment_ids=ids > 0)
    with pytest.raises(ValueError, match="num_segments must be >= 0; got -1"):
        linred.segmented_sum(x, segment_ids=ids, num_segments=-1)
    with pytest.raises(TypeError, match="num_segments must be an integer; got float"):
        linred.segmented_sum(x, segment_ids=ids, num_segments=3.0)
    with pytest.raises(TypeError, match="ids_sorted must be None, True or False"):
        linred.segmented_sum(x, segment_ids=ids, ids_sorted="yes")
    # check takes Python's bools only (its message names NumPy's type); ids_sorted takes NumPy's
    # too, as (np.diff(ids) >= 0).all() gives it, and means what the Python bool means
    with pytest.raises(TypeError, match=r"check must be True or False; got .* \(numpy\.bool_?\)"):
        linred.segmented_sum(x, segment_ids=ids, check=np.True_)
    with pytest.raises(TypeError, match=r"check must be True or False; got .* \(numpy\.bool_?\)"):
        linred.segmented_sum(x, 2, check=np.True_)
    sorted_ids = np.sort(ids)
    promised = linred.segmented_sum(x, segment_ids=sorted_ids, ids_sorted=(np.diff(sorted_ids) >= 0).all(), check=False)
    np.testing.assert_array_equal(promised, linred.segmented_sum(x, segment_ids=sorted_ids))


def test_torch_gradients_flow_through_unsorted_ids():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    ids = torch.as_tensor(rng.integers(0, 4, size=15))
    x = torch.as_tensor(rng.standard_normal((15, 2)), dtype=torch.float64).requires_grad_()
    for name in ("sum", "mean", "max"):
        fn = getattr(linred, f"segmented_{name}")
        assert torch.autograd.gradcheck(lambda t, fn=fn: fn(t, segment_ids=ids, num_segments=4), (x,))


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod", *COMPOSED])
@pytest.mark.parametrize("order", ["sorted", "unsorted"])
def test_dropped_ids_pass_a_gradient_of_zero(name, order):
    """Elements whose ids lie outside the range (``check=False``: dropped) get a gradient of 0,
    and the named segments' elements the float64 reference's, even where the dropped elements'
    own values would overflow (a product of 1e200s, exp(1000)): the composed functions gave them
    NaN (their NaN padding, or 0 * inf), the product its 0 times an overflowed product."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(21)
    ids = rng.integers(-2, 5, 40)
    if order == "sorted":
        ids = np.sort(ids)
    xv = rng.uniform(0.5, 1.5, 40)
    xv[ids < 0] = 1000.0 if name != "prod" else 1e200
    xv[ids >= 3] = 1e200 if name == "prod" else 900.0
    x = torch.tensor(xv, requires_grad=True)
    w = torch.tensor(rng.normal(size=40))
    f = getattr(linred, f"segmented_{name}")
    y = f(x, segment_ids=torch.tensor(ids), num_segments=3, check=False)
    keep = ~torch.isnan(y)  # (softmax and log_softmax: NaN for the elements of no segment)
    (gx,) = torch.autograd.grad(torch.where(keep, y, 0.0).mul(w[: y.shape[0]]).sum(), x)
    inside = (ids >= 0) & (ids < 3)
    assert (gx.numpy()[~inside] == 0).all()
    # the reference: the same function of the elements inside only, by their own ids
    xi = torch.tensor(xv[inside], requires_grad=True)
    yi = f(xi, segment_ids=torch.tensor(ids[inside]), num_segments=3)
    if name in ("softmax", "log_softmax"):
        np.testing.assert_array_equal(np.isnan(y.detach().numpy()), ~inside)
        (gi,) = torch.autograd.grad(yi.mul(w[:40][torch.tensor(inside)]).sum(), xi)
    else:
        (gi,) = torch.autograd.grad(yi.mul(w[:3]).sum(), xi)
    np.testing.assert_allclose(gx.numpy()[inside], gi.numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("reads", [True, False])
def test_dropped_ids_of_a_product_pass_a_gradient_of_zero_on_both_paths(monkeypatch, reads):
    """The product's gradient where the dropped elements' own product overflows, through the
    path of host ids (the data between them alone) and through that of unread (device) ids,
    forced here on CPU tensors (sentinel segments, the dropped counted as 1); and an ``out=``
    with a tensor that requires grad is refused on both, as by the functions."""
    torch = pytest.importorskip("torch")
    from linred import _segment_ids

    monkeypatch.setattr(_segment_ids, "_reads_ids", lambda check, device: reads and (check or device is None))
    x = torch.tensor([1e200, 2.0, 3.0, 1e200, 4.0, 1e200], dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([-1, 0, 0, 5, 1, -3])
    y = linred.segmented_prod(x, segment_ids=ids, num_segments=2, check=False)
    np.testing.assert_array_equal(y.detach().numpy(), [6.0, 4.0])
    (gx,) = torch.autograd.grad(y.sum(), x)
    np.testing.assert_array_equal(gx.numpy(), [0.0, 3.0, 2.0, 0.0, 1.0, 0.0])
    with pytest.raises(TypeError, match="not supported for a tensor that requires grad"):
        linred.segmented_sum(x, segment_ids=ids, num_segments=2, check=False, out=torch.empty(2, dtype=torch.float64))


def test_dropped_ids_do_not_warn_for_their_own_overflow():
    """Host ids outside the range: their elements are not read, so their own overflow neither
    warns nor raises under ``np.errstate(over="raise")`` (their sentinel segment's sum did)."""
    x = np.array([1.0, 2.0, 1e308, 1e308, 4.0])
    ids = [0, 0, -1, -1, 1]
    with np.errstate(over="raise"):
        np.testing.assert_array_equal(linred.segmented_sum(x, segment_ids=ids, num_segments=2, check=False), [3, 4])
        np.testing.assert_array_equal(linred.segmented_prod(x, segment_ids=ids, num_segments=2, check=False), [2, 4])


def test_vmap_of_batched_ids_is_refused():
    """Ids batched by ``torch.func.vmap`` raise a TypeError that says what is served (an internal
    "doesn't have storage" error before); ids without the batch dimension are served."""
    torch = pytest.importorskip("torch")
    xb = torch.randn(2, 4, dtype=torch.float64)
    for name in ("sum", "softmax", "argmax"):
        f = getattr(linred, f"segmented_{name}")
        with pytest.raises(TypeError, match=r"segment_ids is batched by torch\.func\.vmap"):
            torch.func.vmap(lambda t, s, f=f: f(t, segment_ids=s, num_segments=2))(xb, torch.tensor([[0, 0, 1, 1]] * 2))
    got = torch.func.vmap(lambda t: linred.segmented_sum(t, segment_ids=torch.tensor([0, 0, 1, 1]), num_segments=2))(xb)
    torch.testing.assert_close(got, torch.stack([xb[:, :2].sum(1), xb[:, 2:].sum(1)], 1))


def test_jax_arrays_stay_jax():
    jnp = pytest.importorskip("jax.numpy")
    x = np.arange(8.0)
    ids = np.array([1, 0, 1, 2, 0, 2, 2, 1])
    got = linred.segmented_sum(jnp.asarray(x), segment_ids=jnp.asarray(ids), num_segments=4)
    assert type(got).__module__.startswith("jax")
    np.testing.assert_allclose(np.asarray(got), _reference("sum", x, ids, 4, 0))
    got = linred.segmented_argmax(jnp.asarray(x), segment_ids=jnp.asarray(ids))
    np.testing.assert_array_equal(np.asarray(got), _arg_reference("max", x, ids, 3))


@pytest.mark.gpu
@pytest.mark.parametrize("sorted_promise", [True, None])
def test_device_ids_with_check_false_and_num_segments_do_not_synchronize(sorted_promise):
    """check=False with num_segments: the call returns while earlier work on its stream still runs
    (a sleep kernel of about 0.5 s queued before it), then gives the right result once that is done."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import time

    rng = np.random.default_rng(4)
    ids_host = rng.integers(0, 50, size=10_000)
    if sorted_promise:
        ids_host = np.sort(ids_host)
    x = torch.as_tensor(rng.standard_normal((10_000, 8)), device="cuda")
    ids = torch.as_tensor(ids_host, device="cuda")
    kwargs = {"segment_ids": ids, "num_segments": 50, "check": False, "ids_sorted": sorted_promise}
    linred.segmented_sum(x, **kwargs)  # warm: plans and kernels made
    torch.cuda.synchronize()
    torch.cuda._sleep(10**9)  # about 0.5 s at the H100's clocks
    start = time.perf_counter()
    got = linred.segmented_sum(x, **kwargs)
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    assert elapsed < 0.1, f"the call waited {elapsed:.3f} s for the stream"
    expected = _reference("sum", x.cpu().numpy(), ids_host, 50, 0)
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=1e-12)


@pytest.mark.parametrize("check", [True, False])
def test_out_is_checked_on_every_path(array_kind, check):
    """Every path checks out as the call would (the sentinel segments of unchecked device ids and
    the unsorted path compute aside and copy into it; host ids with dropped ones reduce into it)."""
    x = to_kind(np.arange(6.0), array_kind)
    ids = to_kind(np.array([1, 0, 1, 2, 0, 1]), array_kind)
    with pytest.raises(ValueError, match="out must have dtype float64; got float32"):
        linred.segmented_sum(x, segment_ids=ids, num_segments=3, check=check,
                             out=to_kind(np.empty(3, np.float32), array_kind))  # fmt: skip
    with pytest.raises(ValueError, match=r"out must have shape \(3,\); got \(4,\)"):
        linred.segmented_sum(x, segment_ids=ids, num_segments=3, check=check, out=to_kind(np.empty(4), array_kind))


def test_empty_python_list_of_ids(array_kind):
    got = linred.segmented_sum(to_kind(np.zeros(0), array_kind), segment_ids=[], num_segments=3)
    np.testing.assert_array_equal(to_numpy(got), [0.0, 0.0, 0.0])


def test_arrays_the_functions_refuse_are_refused_with_ids():
    """Masked arrays (and the other kinds the functions refuse) are not read as plain data."""
    with pytest.raises(TypeError, match="masked array"):
        linred.segmented_sum(np.ma.array(np.arange(6.0), mask=[0, 1, 0, 0, 0, 0]), segment_ids=[0, 0, 1, 1, 2, 2])


@pytest.mark.gpu
def test_ids_work_runs_on_the_calls_stream():
    """With stream=, the ids' sort and search run on that stream, ahead of the reduction reading them."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rng = np.random.default_rng(12)
    ids_host = rng.integers(0, 300, size=200_000)
    x = torch.as_tensor(rng.standard_normal((200_000, 4)), device="cuda")
    ids = torch.as_tensor(ids_host, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    got = linred.segmented_sum(x, segment_ids=ids, num_segments=300, check=False, stream=side)
    side.synchronize()
    expected = _reference("sum", x.cpu().numpy(), ids_host, 300, 0)
    np.testing.assert_allclose(got.cpu().numpy(), expected, rtol=1e-10)


# --- device ids into offsets by ids.cuh (one launch, the ids' rules tested on the way) ---


@pytest.fixture
def ids_launches(monkeypatch):
    """Counts the launches of the ids' conversion, each of which must launch."""
    from linred.arrays import _device_ids

    return count_calls(monkeypatch, _device_ids, "to_offsets", key="launches", launches="the ids' conversion")


def _gpu_kinds():
    from support.arrays import GPU_KINDS

    return list(GPU_KINDS)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", _gpu_kinds() or [pytest.param("cupy", marks=pytest.mark.skip(reason="needs a GPU"))])
@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_device_sorted_ids_become_offsets_in_one_launch(ids_launches, kind, reduction, dtype):
    """Sorted device ids with num_segments: the kernel writes the offsets (checked calls: exact,
    after one wait; unchecked with the order promised: framed by sentinel segments that take the
    ids outside [0, m)), for 1-D data and feature rows along either axis, empty segments at the
    start, middle and end, n across the kernel's blocks (255, 256, 257, 70,001); against float64."""
    rng = np.random.default_rng(len(reduction) + len(dtype))
    fn = getattr(linred, f"segmented_{reduction}")
    for n, m in ((255, 7), (256, 300), (257, 1), (70_001, 1_000)):
        lo, hi = (1, m - 1) if m > 2 else (0, m)  # (segments 0 and m - 1 empty where there are more than 2)
        ids = np.sort(rng.integers(lo, hi, n)).astype(dtype)
        for shape, axis in (((n,), 0), ((n, 3), 0), ((2, n), 1)):
            x = rng.standard_normal(shape)
            want = _reference(reduction, x, ids, m, axis)
            before = ids_launches["launches"]
            got = fn(to_kind(x, kind), segment_ids=to_kind(ids, kind), num_segments=m, axis=axis)
            np.testing.assert_allclose(to_numpy(got), want, rtol=1e-12)
            got = fn(to_kind(x, kind), segment_ids=to_kind(ids, kind), num_segments=m, axis=axis, check=False,
                     ids_sorted=True)  # fmt: skip
            np.testing.assert_allclose(to_numpy(got), want, rtol=1e-12)
            assert ids_launches["launches"] == before + 2
    # ids outside [0, m), sorted, unchecked with the order promised: dropped (the sentinel segments)
    ids = np.array([-3, -1, 0, 0, 2, 2, 5, 9])
    x = np.arange(8.0)
    got = fn(to_kind(x, kind), segment_ids=to_kind(ids, kind), num_segments=4, check=False, ids_sorted=True)
    np.testing.assert_allclose(to_numpy(got), _reference(reduction, x, ids, 4, 0), rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", _gpu_kinds() or [pytest.param("cupy", marks=pytest.mark.skip(reason="needs a GPU"))])
def test_device_ids_checked_by_the_kernel(ids_launches, kind):
    """A checked call with ids outside [0, m) raises the host's message; unsorted ids go to the sort
    (right results); out= is written, and validated; the next valid call is right."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1_000)
    ids = np.sort(rng.integers(0, 20, 1_000))
    for bad in (ids - 1, ids + 1):  # (a -1 at the start; a 20 at the end)
        with pytest.raises(ValueError, match=r"segment_ids must lie in \[0, num_segments\)"):
            linred.segmented_sum(to_kind(x, kind), segment_ids=to_kind(bad, kind), num_segments=20)
    shuffled = rng.permutation(ids)
    got = linred.segmented_sum(to_kind(x, kind), segment_ids=to_kind(shuffled, kind), num_segments=20)
    np.testing.assert_allclose(to_numpy(got), _reference("sum", x, shuffled, 20, 0), rtol=1e-12)
    out = to_kind(np.full(20, np.nan), kind)
    got = linred.segmented_sum(to_kind(x, kind), segment_ids=to_kind(ids, kind), num_segments=20, out=out)
    assert got is out
    np.testing.assert_allclose(to_numpy(out), _reference("sum", x, ids, 20, 0), rtol=1e-12)
    out = to_kind(np.full(20, np.nan), kind)
    got = linred.segmented_sum(to_kind(x, kind), segment_ids=to_kind(ids, kind), num_segments=20, out=out,
                               check=False, ids_sorted=True)  # fmt: skip
    assert got is out
    np.testing.assert_allclose(to_numpy(out), _reference("sum", x, ids, 20, 0), rtol=1e-12)
    with pytest.raises(ValueError, match="out must have dtype float64; got float32"):
        linred.segmented_sum(to_kind(x, kind), segment_ids=to_kind(ids, kind), num_segments=20,
                             out=to_kind(np.empty(20, np.float32), kind))  # fmt: skip
    assert ids_launches["launches"] >= 6


@pytest.mark.gpu
@pytest.mark.parametrize("kind", _gpu_kinds() or [pytest.param("cupy", marks=pytest.mark.skip(reason="needs a GPU"))])
@pytest.mark.parametrize("n", [1_000, 9_000_001])
def test_device_ids_checked_small_and_large(ids_launches, kind, n):
    """Checked calls of a small and a large (36 MB) float32 vector: ids outside [0, m) raise (and
    the next valid call of the thread is right); unsorted ids are sorted and reduced, into out=
    too; an error of the reduction's own arguments leaves no verdict behind for the next call;
    against a float64 reference."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    ids = np.sort(rng.integers(0, 300, n))
    want = _reference("sum", x.astype(np.float64), ids, 300, 0)
    xk, idk = to_kind(x, kind), to_kind(ids, kind)
    for bad in (ids - 1, ids + 1):
        out = to_kind(np.zeros(300, np.float32), kind)
        with pytest.raises(ValueError, match=r"segment_ids must lie in \[0, num_segments\)"):
            linred.segmented_sum(xk, segment_ids=to_kind(bad, kind), num_segments=300, out=out)
        np.testing.assert_allclose(to_numpy(linred.segmented_sum(xk, segment_ids=idk, num_segments=300)), want,
                                   rtol=2e-5, atol=2e-5 * np.abs(x).max() * np.sqrt(n))  # fmt: skip
    shuffled = rng.permutation(n)
    out = to_kind(np.full(300, np.nan, np.float32), kind)
    got = linred.segmented_sum(to_kind(x[shuffled], kind), segment_ids=to_kind(ids[shuffled], kind), num_segments=300,
                               out=out)  # fmt: skip
    assert got is out
    np.testing.assert_allclose(to_numpy(out), want, rtol=2e-5, atol=2e-5 * np.abs(x).max() * np.sqrt(n))
    with pytest.raises(TypeError, match="dtype must be one of"):  # (after a verdict that the ids are valid)
        linred.segmented_sum(xk, segment_ids=idk, num_segments=300, dtype="no such dtype")
    got = linred.segmented_sum(xk, segment_ids=idk, num_segments=300)
    np.testing.assert_allclose(to_numpy(got), want, rtol=2e-5, atol=2e-5 * np.abs(x).max() * np.sqrt(n))
    assert ids_launches["launches"] >= 6


@pytest.mark.gpu
@pytest.mark.parametrize("kind", _gpu_kinds() or [pytest.param("cupy", marks=pytest.mark.skip(reason="needs a GPU"))])
def test_a_batch_vector_takes_the_short_route(monkeypatch, ids_launches, kind):
    """PyG's call (sorted int32 or int64 device ids of the data's library, num_segments an int):
    served without the general route's steps (one launch converts the ids, int32 ones as they
    are); what that route serves (a stream, ids of another dtype, unsorted ids) still gives the
    right results."""
    from linred import _segment_ids

    general = _segment_ids._by_ids

    def refused(*args, **kwargs):
        raise AssertionError("the general route")

    rng = np.random.default_rng(17)
    ids = np.sort(rng.integers(0, 50, 3_001))
    x = rng.standard_normal((3_001, 5))
    monkeypatch.setattr(_segment_ids, "_by_ids", refused)
    for dtype in ("int32", "int64"):
        idk = to_kind(ids.astype(dtype), kind)
        for axis, data in ((0, x), (-1, x.T.copy()), (0, x[:, 0].copy())):
            want = _reference("sum", data, ids, 50, axis % data.ndim)
            got = linred.segmented_sum(to_kind(data, kind), segment_ids=idk, num_segments=50, axis=axis)
            np.testing.assert_allclose(to_numpy(got), want, rtol=1e-12)
            got = linred.segmented_mean(to_kind(data, kind), segment_ids=idk, num_segments=50, axis=axis,
                                        check=False, ids_sorted=True)  # fmt: skip
            counts = np.bincount(ids, minlength=50).astype(float)
            shape = [1] * data.ndim
            shape[axis] = 50
            np.testing.assert_allclose(to_numpy(got), want / np.maximum(counts, 1).reshape(shape), rtol=1e-12)
    monkeypatch.setattr(_segment_ids, "_by_ids", general)
    shuffled = rng.permutation(3_001)
    for call_ids, data in ((ids.astype(np.int16), x), (ids[shuffled], x[shuffled])):
        got = linred.segmented_sum(to_kind(data, kind), segment_ids=to_kind(call_ids, kind), num_segments=50)
        np.testing.assert_allclose(to_numpy(got), _reference("sum", x, ids, 50, 0), rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_device_ids_kernel_with_autograd_and_in_a_graph(ids_launches):
    """torch: the gradient through the kernel's offsets (sum; a product with dropped ids passes
    them 0), and an unchecked call with the order promised captured in a CUDA graph, replayed
    with other ids in the same tensor."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rng = np.random.default_rng(9)
    ids_host = np.sort(rng.integers(0, 40, 5_000))
    x = torch.as_tensor(rng.standard_normal((5_000, 4)), device="cuda", dtype=torch.float64).requires_grad_()
    ids = torch.as_tensor(ids_host, device="cuda")
    y = linred.segmented_sum(x, segment_ids=ids, num_segments=40)
    (y * torch.arange(40.0, device="cuda", dtype=torch.float64)[:, None]).sum().backward()
    np.testing.assert_allclose(x.grad.cpu().numpy(), np.repeat(ids_host[:, None].astype(np.float64), 4, 1))
    small = torch.tensor([2.0, 3.0, 4.0, 1e300, 1e300], device="cuda", dtype=torch.float64, requires_grad=True)
    p = linred.segmented_prod(small, segment_ids=torch.tensor([0, 0, 1, 5, 5], device="cuda"), num_segments=2,
                              check=False, ids_sorted=True)  # fmt: skip
    p.sum().backward()
    np.testing.assert_allclose(small.grad.cpu().numpy(), [3.0, 2.0, 1.0, 0.0, 0.0])
    xs = torch.as_tensor(rng.standard_normal(5_000), device="cuda")
    capturing = torch.cuda.Stream()
    capturing.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capturing):
        linred.segmented_sum(xs, segment_ids=ids, num_segments=40, check=False, ids_sorted=True)
    capturing.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capturing):
        captured = linred.segmented_sum(xs, segment_ids=ids, num_segments=40, check=False, ids_sorted=True)
    other = np.sort(rng.integers(0, 40, 5_000))
    ids.copy_(torch.as_tensor(other, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    np.testing.assert_allclose(captured.cpu().numpy(), _reference("sum", xs.cpu().numpy(), other, 40, 0), rtol=1e-10)


# --- unsorted device ids: a stable sort (int32 keys from NARROW_KEYS_MIN), a gather, a reduction ---


def _float64_reference(reduction: str, x: np.ndarray, ids: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The float64 sums or means of ``x``'s rows by id (ids outside [0, m) in none), and each
    segment's sum of magnitudes (the scale of its rounding error)."""
    x64 = x.astype(np.float64)
    inside = (ids >= 0) & (ids < m)
    shape = (m, *x.shape[1:])
    sums, scale = np.zeros(shape), np.zeros(shape)
    np.add.at(sums, ids[inside], x64[inside])
    np.add.at(scale, ids[inside], np.abs(x64[inside]))
    if reduction == "mean":
        counts = np.bincount(ids[inside], minlength=m).reshape((m,) + (1,) * (x.ndim - 1)).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return sums / counts, scale / np.maximum(counts, 1)
    return sums, scale


@pytest.mark.gpu
@pytest.mark.parametrize("kind", _gpu_kinds() or [pytest.param("cupy", marks=pytest.mark.skip(reason="needs a GPU"))])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_unsorted_device_ids(kind, reduction, dtype):
    """Unsorted device ids (checked, and unchecked with ids outside [0, m) dropped, among them
    ids past the int32 range), for 1-D data and feature rows of 1 to 64 features (2-D and 3-D),
    n on both sides of the sort's narrowing of its keys (2^15) and small, empty segments,
    non-finite values (also in dropped rows), out=; the same bits from call to call; against
    float64."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    from linred._segment_ids import NARROW_KEYS_MIN

    rng = np.random.default_rng(len(dtype) * 7 + len(reduction))
    fn = getattr(linred, f"segmented_{reduction}")
    tol = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-5, "float64": 1e-12}[dtype]
    np_dtype = np.dtype("bfloat16") if dtype == "bfloat16" else np.dtype(dtype)
    for n, m in ((7, 3), (1_000, 37), (NARROW_KEYS_MIN - 1, 500), (NARROW_KEYS_MIN, 1), (NARROW_KEYS_MIN + 1, 4096)):
        for features in ((), (1,), (3,), (64,), (2, 5)):
            if n * int(np.prod(features)) > 3_000_000:
                continue
            x = rng.standard_normal((n, *features)).astype(np_dtype)
            ids = rng.integers(0, m, n)
            ids[rng.random(n) < 0.01] = 0  # (a longer segment 0, and segment m - 1 sometimes empty)
            if m > 2:
                ids[ids == m - 2] = m - 1  # (segment m - 2 empty)
            ids[0], ids[-1] = m - 1, 0  # (out of order, but where m = 1)
            if n > 10:
                x[3] = np.inf
                x[5] = -np.inf if dtype != "float16" else np.nan
            for check in (True, False):
                call_ids = ids.copy()
                if not check and n > 10:
                    call_ids[[0, 4, 9, 10]] = [-5, m, m + 10, 2**40]  # dropped: x[4] is inf, which must not show
                    x[4] = np.inf
                want, scale = _float64_reference(reduction, x, call_ids, m)
                xk, idk = to_kind(x, kind), to_kind(call_ids, kind)
                got = fn(xk, segment_ids=idk, num_segments=m, check=check)
                again = fn(xk, segment_ids=idk, num_segments=m, check=check)
                np.testing.assert_array_equal(to_numpy(got).view(np.uint8), to_numpy(again).view(np.uint8))
                got64 = to_numpy(got).astype(np.float64)
                assert got64.shape == want.shape
                finite, nan = np.isfinite(want), np.isnan(want)
                np.testing.assert_array_equal(np.isnan(got64), nan)
                np.testing.assert_array_equal(got64[~finite & ~nan], want[~finite & ~nan])
                bound = tol * (scale[finite] + np.abs(want[finite])) + 1e-300
                np.testing.assert_array_less(np.abs(got64 - want)[finite], bound)
            out = to_kind(np.full(want.shape, np.nan, dtype=np_dtype), kind)
            got = fn(to_kind(x, kind), segment_ids=to_kind(ids, kind), num_segments=m, out=out)
            assert got is out
            alone = fn(to_kind(x, kind), segment_ids=to_kind(ids, kind), num_segments=m)
            np.testing.assert_array_equal(to_numpy(out).view(np.uint8), to_numpy(alone).view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", _gpu_kinds() or [pytest.param("cupy", marks=pytest.mark.skip(reason="needs a GPU"))])
def test_checked_device_ids_out_of_order_and_outside_raise(kind):
    """Checked ids both out of order and outside [0, m), in calls of many blocks of the ids'
    kernel, raise with the first such id (each rule's bit kept whatever the threads that found
    them); out of order alone, they are sorted and reduced without being read again."""
    rng = np.random.default_rng(11)
    for n in (70_001, 300_000):
        x = rng.standard_normal((n, 2)).astype(np.float32)
        ids = rng.integers(0, 1000, n)
        want, scale = _float64_reference("sum", x, ids, 1000)
        got = linred.segmented_sum(to_kind(x, kind), segment_ids=to_kind(ids, kind), num_segments=1000)
        np.testing.assert_array_less(np.abs(to_numpy(got) - want), 1e-5 * scale + 1e-30)
        for bad in (n - 1, n // 2, 0):  # (an id of 1000 last, in the middle, first)
            wrong = ids.copy()
            wrong[bad] = 1000
            with pytest.raises(ValueError, match=r"segment_ids\[" + str(bad) + r"\] = 1000"):
                linred.segmented_sum(to_kind(x, kind), segment_ids=to_kind(wrong, kind), num_segments=1000)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", _gpu_kinds() or [pytest.param("cupy", marks=pytest.mark.skip(reason="needs a GPU"))])
@pytest.mark.parametrize(
    "dtype", ["float16", "bfloat16", "float32", "float64", "complex64", "complex128", "int8", "int64", "bool"]
)
def test_device_rows_gathered_by_the_kernel(monkeypatch, kind, dtype):
    """The rows' gather into the ids' order (gather.cuh, words of 16 down to 1 bytes as the rows'
    bytes and addresses allow): rows of 0 to 64 elements, 1-D and 3-D, a view one element past an
    allocation's start, n across the kernel's blocks and none, against NumPy's take."""
    from linred import _segment_ids
    from linred.arrays import _device_gather, as_array

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    launches = count_calls(monkeypatch, _device_gather, "gather_rows", key="n", launches="the gather")
    monkeypatch.setattr(_segment_ids, "GATHER_MIN_ROWS", 0)  # (every size: the small ones too)
    rng = np.random.default_rng(len(dtype))
    np_dtype = np.dtype("bfloat16") if dtype == "bfloat16" else np.dtype(dtype)
    for n in (1, 255, 256, 257, 70_001):
        for shape in ((n,), (n, 0), (n, 1), (n, 3), (n, 5), (n, 64), (n, 2, 3)):
            data = (rng.standard_normal((n + 1, *shape[1:])) * 100).astype(np_dtype)
            for start in (0, 1):  # (one row in: addresses that are not 16-byte aligned)
                host = data[start : start + n]
                a = to_kind(data, kind)[start : start + n]
                x, adapter = as_array(a)
                ops = _segment_ids._Ops(adapter, x)
                for index in (rng.permutation(n), rng.integers(0, n, n // 2), np.zeros(0, np.int64)):
                    before = launches["n"]
                    got = ops.take(x, to_kind(index.astype(np.int64), kind), 0)
                    assert launches["n"] == before + 1
                    want = np.take(host, index, axis=0)
                    np.testing.assert_array_equal(to_numpy(got).view(np.uint8), want.view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", _gpu_kinds() or [pytest.param("cupy", marks=pytest.mark.skip(reason="needs a GPU"))])
def test_device_rows_gathered_by_the_kernel_from_its_size(monkeypatch, kind):
    """The kernel gathers GATHER_MIN_ROWS rows or more, the library fewer; an unsorted call of
    that size is right (float32 rows against float64)."""
    from linred import _segment_ids
    from linred.arrays import _device_gather

    launches = count_calls(monkeypatch, _device_gather, "gather_rows", key="n")
    rng = np.random.default_rng(3)
    for n, kernel in ((_segment_ids.GATHER_MIN_ROWS - 1, 0), (_segment_ids.GATHER_MIN_ROWS, 2)):  # (the ids and x)
        x = rng.standard_normal((n, 4)).astype(np.float32)
        ids = rng.integers(0, 700, n)
        want, scale = _float64_reference("sum", x, ids, 700)
        got = linred.segmented_sum(to_kind(x, kind), segment_ids=to_kind(ids, kind), num_segments=700, check=False)
        np.testing.assert_array_less(np.abs(to_numpy(got) - want), 1e-5 * scale + 1e-30)
        assert launches["n"] == kernel
        launches["n"] = 0


@pytest.mark.gpu
def test_device_rows_of_a_dual_tensor_are_refused_not_gathered_without_their_tangent(monkeypatch):
    """A dual tensor of forward-mode AD with unsorted ids is refused with the documented
    TypeError, as before the rows' gather kernel (whose copy would drop the tangent)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import torch.autograd.forward_ad as fwad

    from linred import _segment_ids

    monkeypatch.setattr(_segment_ids, "GATHER_MIN_ROWS", 0)
    x = torch.randn(1_000, 3, device="cuda", dtype=torch.float64)
    ids = torch.randint(0, 10, (1_000,), device="cuda")
    with fwad.dual_level():
        dual = fwad.make_dual(x, torch.ones_like(x))
        with pytest.raises(TypeError, match="forward"):
            linred.segmented_sum(dual, segment_ids=ids, num_segments=10, check=False)


def test_int32_ids_with_a_count_past_int32_take_the_general_route(monkeypatch):
    """int32 ids compared with a num_segments of 2^31 or more would wrap in the array library:
    the short route leaves such calls to the general one, which widens the ids first (int64 ids
    and smaller counts take the short route)."""
    torch = pytest.importorskip("torch")
    from linred import _segment_ids
    from linred.arrays._torch import TORCH

    taken = []
    monkeypatch.setattr(TORCH, "device_of", lambda t: 0)  # (a CPU tensor seen as on device 0)
    monkeypatch.setattr(_segment_ids, "_by_ids_kernel", lambda *args: taken.append(args[6]) or "served")
    x = torch.ones(3)
    for dtype, ns, short in ((torch.int32, 2**31, False), (torch.int32, 2**31 - 1, True), (torch.int64, 2**31, True)):
        taken.clear()
        got = _segment_ids._device_batch(linred.segmented_sum, x, torch.tensor([0, 1, 2], dtype=dtype), ns, None, 0,
                                         None, True, {})  # fmt: skip
        assert (got == "served") is short and bool(taken) is short, (dtype, ns)


def test_export_of_unsorted_ids_keeps_a_dynamic_length():
    """torch.export of a call with segment ids and a dynamic n: the rows' gather adds no guard on
    n (its size test is not traced)."""
    torch = pytest.importorskip("torch")

    class Pool(torch.nn.Module):
        def forward(self, x, ids):
            return linred.segmented_sum(x, segment_ids=ids, num_segments=4, check=False)

    rng = np.random.default_rng(8)
    n = torch.export.Dim("n", min=2, max=1 << 20)
    x, ids = torch.randn(1_000, 2), torch.randint(0, 4, (1_000,))
    exported = torch.export.export(Pool(), (x, ids), dynamic_shapes={"x": {0: n}, "ids": {0: n}})
    (bounds,) = exported.range_constraints.values()
    assert bounds.upper == 1 << 20
    x2, ids2 = rng.standard_normal((200_000, 2)).astype(np.float32), rng.integers(0, 4, 200_000)
    want, scale = _float64_reference("sum", x2, ids2, 4)
    got = exported.module()(torch.from_numpy(x2), torch.from_numpy(ids2)).numpy()
    np.testing.assert_array_less(np.abs(got - want), 1e-6 * scale)  # (float32 sums: within 1e-6 of their scale)


def test_unsorted_ids_of_an_unaligned_cpu_tensor():
    """A complex128 CPU tensor over unaligned memory (torch.from_numpy of an unaligned NumPy view)
    with unsorted ids: reduced as NumPy reduces it, with autograd's gradient too (PyTorch's CPU
    index_select of such data ends the process, so the call runs in a subprocess)."""
    pytest.importorskip("torch")
    from support.scripts import run_script

    run_script(
        """
            import numpy as np, torch, linred
            n = 2824
            buf = np.zeros(n * 16 + 1, np.uint8)
            a = buf[1:].view(np.complex128)
            a[:] = np.arange(n) + 1j
            ids = np.random.default_rng(0).integers(0, 9, n).astype(np.int32)
            want = np.array([a[ids == i].sum() for i in range(9)])
            t = torch.from_numpy(a)
            assert t.data_ptr() % 16 != 0
            got = linred.segmented_sum(t, segment_ids=torch.from_numpy(ids)).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-12)
            r = torch.from_numpy(buf[1:].view(np.float64)[:n].copy())  # (aligned: a gradient through the gather)
            f = torch.from_numpy(buf[1 : 1 + 8 * n].view(np.float64))
            f.copy_(r)
            f.requires_grad_()
            linred.segmented_sum(f, segment_ids=torch.from_numpy(ids), num_segments=9).sum().backward()
            np.testing.assert_array_equal(f.grad.numpy(), np.ones(n))
            print("ok")
        """
    )
