"""Bad input: every case raises ValueError/TypeError/AxisError/BackendError with a message naming the
parameter, the rule and the offending value, on every array kind."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from support import (
    CONTRACT_BACKENDS,
    FUNCTIONS,
    GPU_BACKENDS,
    HAS_TORCH,
    REDUCTIONS,
    check_refusal,
    empty_like_kind,
    is_gpu_kind,
    to_kind,
)

import linred
import linred.backends as registry

if HAS_TORCH:
    import torch

# x has n = 12 along axis 0
SEGMENT_ERRORS = {
    "no spec": ({}, TypeError, r"exactly one of segment_length, offsets or lengths must be given; got none"),
    "length and offsets": (
        {"segment_length": 4, "offsets": [0, 12]},
        TypeError,
        r"exactly one of segment_length, offsets or lengths must be given; got segment_length and offsets",
    ),
    "offsets and lengths": (
        {"offsets": [0, 12], "lengths": [12]},
        TypeError,
        r"exactly one of .* got offsets and lengths",
    ),
    "all three": (
        {"segment_length": 4, "offsets": [0, 12], "lengths": [12]},
        TypeError,
        r"got segment_length and offsets and lengths",
    ),
    "L=0": ({"segment_length": 0}, ValueError, r"segment_length must be >= 1; got 0"),
    "L<0": ({"segment_length": -4}, ValueError, r"segment_length must be >= 1; got -4"),
    "L float": ({"segment_length": 4.0}, TypeError, r"segment_length must be an integer; got float 4\.0"),
    "L numpy float": ({"segment_length": np.float64(4)}, TypeError, r"segment_length must be an integer; got float64"),
    "L bool": ({"segment_length": True}, TypeError, r"segment_length must be an integer; got bool True"),
    "L str": ({"segment_length": "4"}, TypeError, r"segment_length must be an integer; got str '4'"),
    "L not dividing": (
        {"segment_length": 5},
        ValueError,
        r"segment_length=5 does not divide the length of axis 0 \(n=12\)",
    ),
    "L > n": ({"segment_length": 24}, ValueError, r"segment_length=24 does not divide the length of axis 0 \(n=12\)"),
    "offsets decreasing": (
        {"offsets": [0, 8, 4, 12]},
        ValueError,
        r"offsets must be non-decreasing: offsets\[2\]=4 < offsets\[1\]=8",
    ),
    "offsets negative step first": (
        {"offsets": [0, -1, 12]},
        ValueError,
        r"offsets must be non-decreasing: offsets\[1\]=-1 < offsets\[0\]=0",
    ),
    "offsets not from 0": ({"offsets": [1, 8, 12]}, ValueError, r"offsets\[0\] must be 0; got 1"),
    "offsets not to n": (
        {"offsets": [0, 8, 11]},
        ValueError,
        r"offsets\[-1\] must equal the length of axis 0 \(n=12\); got 11",
    ),
    "offsets past n": (
        {"offsets": [0, 8, 13]},
        ValueError,
        r"offsets\[-1\] must equal the length of axis 0 \(n=12\); got 13",
    ),
    "offsets float": (
        {"offsets": [0.0, 8.0, 12.0]},
        TypeError,
        r"offsets must be an array of integers; got dtype float",
    ),
    "offsets bool": ({"offsets": [False, True]}, TypeError, r"offsets must be an array of integers; got dtype bool"),
    "offsets 2-D": ({"offsets": [[0, 8, 12]]}, ValueError, r"offsets must be 1-D; got shape \(1, 3\)"),
    "offsets 0-d": ({"offsets": 12}, ValueError, r"offsets must be 1-D; got shape \(\)"),
    "offsets empty": ({"offsets": []}, ValueError, r"offsets must have at least one element .*; got an empty array"),
    "offsets str": ({"offsets": "abc"}, TypeError, r"offsets must be an array of integers"),
    "offsets ragged": ({"offsets": [[0], [4, 12]]}, TypeError, r"offsets must be an array of integers"),
    "lengths negative": ({"lengths": [4, -2, 10]}, ValueError, r"lengths must be non-negative: lengths\[1\]=-2"),
    "lengths short": (
        {"lengths": [4, 4]},
        ValueError,
        r"lengths must sum to the length of axis 0 \(n=12\); got 8",
    ),
    "lengths long": ({"lengths": [4, 9]}, ValueError, r"lengths must sum to the length of axis 0 \(n=12\); got 13"),
    "lengths empty": ({"lengths": []}, ValueError, r"lengths must sum to the length of axis 0 \(n=12\); got 0"),
    "lengths float": ({"lengths": [4.0, 8.0]}, TypeError, r"lengths must be an array of integers; got dtype float"),
    "lengths 2-D": ({"lengths": [[4, 8]]}, ValueError, r"lengths must be 1-D; got shape \(1, 2\)"),
}

#: cases whose spec is an array and can also be given as an array of x's kind
ARRAY_SPECS = [k for k, (kw, _, _) in SEGMENT_ERRORS.items() if any(isinstance(v, list) for v in kw.values())]


def _as_kind(kwargs: dict[str, Any], kind: str) -> dict[str, Any]:
    out = {}
    for key, value in kwargs.items():
        if isinstance(value, list) and key in ("offsets", "lengths"):
            a = np.asarray(value)
            if a.size == 0:
                a = a.astype(np.int64)
            out[key] = to_kind(a, kind)
        else:
            out[key] = value
    return out


@pytest.mark.parametrize("case", list(SEGMENT_ERRORS))
@pytest.mark.parametrize("reduction", ["sum", "max"])
def test_bad_segments(array_kind, case, reduction):
    kwargs, error, match = SEGMENT_ERRORS[case]
    x = to_kind(np.arange(12, dtype=np.float32), array_kind)
    with pytest.raises(error, match=match):
        FUNCTIONS[reduction](x, **kwargs)


@pytest.mark.parametrize("case", ARRAY_SPECS)
def test_bad_segments_as_arrays_of_the_kind(array_kind, case):
    kwargs, error, match = SEGMENT_ERRORS[case]
    if case == "offsets ragged":
        pytest.skip("no ragged arrays")
    x = to_kind(np.arange(12, dtype=np.float32), array_kind)
    kwargs = _as_kind(kwargs, array_kind)
    with pytest.raises(error, match=match.replace("dtype float", "dtype float(64)?")):
        linred.segmented_sum(x, **kwargs)


def test_bad_segments_with_axis(array_kind):
    """The messages name the axis the segments run along and its length."""
    x = to_kind(np.zeros((3, 10), dtype=np.float32), array_kind)
    with pytest.raises(ValueError, match=r"segment_length=4 does not divide the length of axis 1 \(n=10\)"):
        linred.segmented_sum(x, 4, axis=1)
    with pytest.raises(ValueError, match=r"offsets\[-1\] must equal the length of axis 1 \(n=10\); got 12"):
        linred.segmented_sum(x, offsets=[0, 12], axis=-1)
    with pytest.raises(ValueError, match=r"lengths must sum to the length of axis 0 \(n=3\); got 10"):
        linred.segmented_sum(x, lengths=[10])


def test_segment_length_accepts_integer_types(array_kind):
    x = to_kind(np.arange(12, dtype=np.float32), array_kind)
    for L in (4, np.int8(4), np.int32(4), np.int64(4), np.uint64(4)):
        np.testing.assert_array_equal(np.asarray(linred.segmented_sum(x, L).tolist()), [6, 22, 38])


AXIS_ERRORS = {
    "axis=1 of 1-D": (1, np.exceptions.AxisError, r"axis 1 is out of bounds for array of dimension 1"),
    "axis=-2 of 1-D": (-2, np.exceptions.AxisError, r"axis -2 is out of bounds for array of dimension 1"),
    "axis float": (0.0, TypeError, r"axis must be an integer; got float 0\.0"),
    "axis None": (None, TypeError, r"axis must be an integer; got NoneType None"),
    "axis str": ("0", TypeError, r"axis must be an integer; got str '0'"),
    "axis bool": (False, TypeError, r"axis must be an integer; got bool False"),
    "axis tuple": ((0,), TypeError, r"axis must be an integer; got tuple"),
}


@pytest.mark.parametrize("case", list(AXIS_ERRORS))
def test_bad_axis(array_kind, case):
    axis, error, match = AXIS_ERRORS[case]
    x = to_kind(np.arange(12, dtype=np.float32), array_kind)
    with pytest.raises(error, match=match):
        linred.segmented_sum(x, 4, axis=axis)


def test_axis_error_is_also_value_and_index_error(array_kind):
    x = to_kind(np.arange(12, dtype=np.float32), array_kind)
    for error in (ValueError, IndexError):
        with pytest.raises(error):
            linred.segmented_mean(x, 4, axis=3)


DTYPE_ERRORS = {
    "int7": "int7",
    "object": object,
    "str": str,
    "U4": "U4",
    "datetime": "datetime64[s]",
    "nonsense": "not a dtype",
    "list": [np.float32],
}


@pytest.mark.parametrize("case", list(DTYPE_ERRORS))
def test_bad_dtype(array_kind, case):
    x = to_kind(np.arange(12, dtype=np.float32), array_kind)
    with pytest.raises(TypeError, match=r"dtype must be one of bool, int8, .*complex128; got "):
        linred.segmented_sum(x, 4, dtype=DTYPE_ERRORS[case])


def test_unknown_backend_lists_the_valid_names(array_kind):
    x = to_kind(np.arange(12, dtype=np.float32), array_kind)
    with pytest.raises(
        ValueError, match=r"backend must be one of 'auto', 'numpy', 'nvmath', 'cublas', 'cub'.*; got 'blas'"
    ):
        linred.segmented_sum(x, 4, backend="blas")
    with pytest.raises(ValueError, match=r"got 'AUTO'"):
        linred.segmented_sum(x, 4, backend="AUTO")


@pytest.mark.parametrize("bad", [None, 1, b"numpy", ["numpy"], np.array(["auto", "numpy"])], ids=str)
def test_backend_not_a_string(array_kind, bad):
    x = to_kind(np.arange(12, dtype=np.float32), array_kind)
    with pytest.raises(TypeError, match=r"backend must be a string, one of 'auto', 'numpy'.*; got "):
        linred.segmented_sum(x, 4, backend=bad)


@pytest.mark.parametrize("check", [1, None, "yes", np.bool_(True)])
def test_check_not_a_bool(array_kind, check):
    x = to_kind(np.arange(12, dtype=np.float32), array_kind)
    with pytest.raises(TypeError, match=r"check must be True or False; got "):
        linred.segmented_sum(x, offsets=[0, 12], check=check)


_KINDS = (
    r"x must be a NumPy, CuPy or PyTorch array or a sequence of numbers \(the functions also take JAX and "
    r"Dask arrays\); got "
)
X_ERRORS = {
    "str": ("abc", TypeError, _KINDS + r"str"),
    "bytes": (b"abc", TypeError, _KINDS + r"bytes"),
    "None": (None, TypeError, _KINDS + r"NoneType"),
    "dict": ({"a": 1}, TypeError, _KINDS + r"dict"),
    "set": ({1, 2}, TypeError, _KINDS + r"set"),
    "list of str": ([["a"]], TypeError, r"x must hold numbers; got list converted to dtype <U1"),
    "ragged": ([[1], [1, 2]], TypeError, r"x must be a NumPy.* got list that NumPy cannot convert"),
    "0-d array": (np.float64(3.0), ValueError, r"x must have at least one dimension; got a 0-d array"),
    "0-d ndarray": (np.array(3.0), ValueError, r"x must have at least one dimension; got a 0-d array"),
    "Python float": (3.0, ValueError, r"x must have at least one dimension; got a 0-d array"),
}


@pytest.mark.parametrize("case", list(X_ERRORS))
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_bad_x(case, reduction):
    x, error, match = X_ERRORS[case]
    with pytest.raises(error, match=match):
        FUNCTIONS[reduction](x, 1)


@pytest.mark.parametrize(
    "x",
    [np.array(["a", "b"]), np.array([1, None], dtype=object), np.array(["2020-01-01"], dtype="datetime64[D]")],
    ids=["str", "object", "datetime"],
)
def test_x_of_unsupported_dtype_names_x(x):
    """A NumPy array of an unsupported dtype: the message must be about x (not the dtype= argument)."""
    with pytest.raises(TypeError) as info:
        linred.segmented_sum(x, 1)
    message = str(info.value)
    assert re.search(r"\bx\b", message), f"the message does not name x: {message}"
    assert any(s in message for s in (str(x.dtype), x.dtype.name, repr(x.dtype))), f"no dtype named: {message}"


def test_zero_dim_tensor(array_kind):
    x = to_kind(np.array(3.0, dtype=np.float32), array_kind)
    with pytest.raises(ValueError, match=r"x must have at least one dimension; got a 0-d array"):
        linred.segmented_sum(x, 1)


def test_stream_for_host_data(array_kind):
    if is_gpu_kind(array_kind):
        pytest.skip("host data only")
    x = to_kind(np.arange(12, dtype=np.float32), array_kind)
    match = r"stream must be None for host \(NumPy\) arrays" if array_kind == "numpy" else "stream must be None for CPU"
    with pytest.raises(ValueError, match=match):
        linred.segmented_sum(x, 4, stream=1)


@pytest.mark.parametrize("gpu_backend", [b for b in GPU_BACKENDS if b != "nvmath"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gpu_only_backend_refuses_host_data(array_kind, gpu_backend, reduction):
    """A GPU-only backend named for host data raises BackendError naming itself (no host fallback)."""
    if is_gpu_kind(array_kind):
        pytest.skip("host data only")
    x = to_kind(np.arange(12, dtype=np.float32), array_kind)
    with pytest.raises(linred.BackendError) as info:
        FUNCTIONS[reduction](x, 4, backend=gpu_backend)
    check_refusal(info.value, gpu_backend)


def test_backend_names_are_the_contract():
    assert set(CONTRACT_BACKENDS) <= set(registry.BACKENDS)
    assert registry.BACKENDS[0] == "numpy"


# ---------------------------------------------------------------------------
# out=
# ---------------------------------------------------------------------------


def _bad_outs(kind: str) -> dict[str, tuple[Any, type, str]]:
    """Wrong ``out`` arguments for segmented_sum(float32 x of shape (12, 2), 4): result (3, 2) float32."""
    cases: dict[str, tuple[Any, type, str]] = {
        "shape": (empty_like_kind(kind, (3,), "float32"), ValueError, r"out must have shape \(3, 2\); got \(3,\)"),
        "shape transposed": (
            empty_like_kind(kind, (2, 3), "float32"),
            ValueError,
            r"out must have shape \(3, 2\); got \(2, 3\)",
        ),
        "dtype": (empty_like_kind(kind, (3, 2), "float64"), ValueError, r"out must have dtype float32; got float64"),
        "int dtype": (empty_like_kind(kind, (3, 2), "int32"), ValueError, r"out must have dtype float32; got int32"),
        "list": ([[0.0, 0.0]] * 3, TypeError, r"out must be a .* like x; got builtins\.list"),
        "non-contiguous": (
            empty_like_kind(kind, (3, 4), "float32")[:, ::2],
            ValueError,
            r"out must be C-contiguous",
        ),
        "transposed": (empty_like_kind(kind, (2, 3), "float32").T, ValueError, r"out must be C-contiguous"),
    }
    type_name = {"numpy": "numpy.ndarray", "cupy": "cupy.ndarray"}.get(kind, "torch.Tensor")
    if kind != "numpy":
        cases["numpy out"] = (np.empty((3, 2), np.float32), TypeError, rf"out must be a {type_name} like x; got numpy")
    elif HAS_TORCH:
        cases["torch out"] = (torch.empty((3, 2)), TypeError, r"out must be a numpy\.ndarray like x; got torch")
    if kind == "numpy":
        readonly = np.empty((3, 2), np.float32)
        readonly.flags.writeable = False
        cases["read-only"] = (readonly, ValueError, r"out must be writeable")
    if kind == "torch-cuda":
        cases["host tensor"] = (torch.empty((3, 2)), ValueError, r"out must be on CUDA device 0 like x; got the host")
    if kind == "torch-cpu" and torch.cuda.is_available():
        cases["cuda tensor"] = (
            torch.empty((3, 2), device="cuda"),
            ValueError,
            r"out must be on the host like x; got CUDA device 0",
        )
    return cases


_OUT_CASES = [
    "shape",
    "shape transposed",
    "dtype",
    "int dtype",
    "list",
    "non-contiguous",
    "transposed",
    "numpy out",
    "torch out",
    "read-only",
    "host tensor",
    "cuda tensor",
]


@pytest.mark.parametrize("case", _OUT_CASES)
@pytest.mark.parametrize("how", ["fixed", "offsets"])
def test_bad_out(array_kind, case, how):
    cases = _bad_outs(array_kind)
    if case not in cases:
        pytest.skip(f"not applicable to {array_kind}")
    out, error, match = cases[case]
    x = to_kind(np.ones((12, 2), dtype=np.float32), array_kind)
    kwargs = {"segment_length": 4} if how == "fixed" else {"offsets": [0, 4, 8, 12]}
    with pytest.raises(error, match=match):
        linred.segmented_sum(x, out=out, **kwargs)


def test_bad_out_leaves_out_alone(array_kind):
    """A rejected out is not written to."""
    x = to_kind(np.ones((12, 2), dtype=np.float32), array_kind)
    out = to_kind(np.full((3,), 7.0, dtype=np.float32), array_kind)
    with pytest.raises(ValueError):
        linred.segmented_sum(x, 4, out=out)
    np.testing.assert_array_equal(np.asarray(out.tolist()), [7.0, 7.0, 7.0])


def test_tensors_on_other_devices_are_refused():
    """A tensor on a device linred does not serve (here ``meta``), as data or as offsets, raises
    a TypeError that names the device type, not a reduction of nothing."""
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="device type 'meta'"):
        linred.segmented_sum(torch.empty(8, device="meta"), 4)
    x = torch.ones(8)
    linred.segmented_sum(x, offsets=torch.tensor([0, 4, 8]))  # (a plan for CPU offsets first)
    with pytest.raises(TypeError, match="device type 'meta'"):
        linred.segmented_sum(x, offsets=torch.tensor([0, 4, 8], device="meta"))


@pytest.mark.parametrize("name", ["offsets", "lengths", "segment_ids"])
def test_a_list_of_integers_past_int64_names_the_range(name):
    """A list of Python integers one of which passes int64 (NumPy would make it float64): the
    range is named, not the dtype float64."""
    big = 2**63 + 5
    value = {"offsets": [0, big, 6], "lengths": [big, 6], "segment_ids": [0, 0, 1, big, 1, 0]}[name]
    with pytest.raises(ValueError, match=rf"{name} must fit in int64; got {big}"):
        linred.segmented_sum(np.arange(6.0), **{name: value})


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
@pytest.mark.parametrize("layout", ["csr", "csc", "bsr", "bsc", "coo", "nested"])
@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min", "prod", "argmax", "softmax"])
def test_sparse_and_nested_tensors_are_refused_by_name(layout, reduction):
    """A torch tensor of a sparse layout, or a nested tensor, as x: the TypeError naming x (sum,
    mean, max, min and prod raised PyTorch's own RuntimeError: their plan's key read strides such
    a tensor lacks)."""
    import warnings

    dense = torch.arange(6.0).reshape(3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (PyTorch's beta and prototype notices)
        if layout == "nested":
            x = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(2.0)])
        elif layout == "coo":
            x = dense.to_sparse()
        elif layout in ("bsr", "bsc"):
            x = getattr(dense, f"to_sparse_{layout}")((1, 1))
        else:
            x = getattr(dense, f"to_sparse_{layout}")()
    with pytest.raises(TypeError, match=r"^x is a (nested )?torch tensor"):
        getattr(linred, f"segmented_{reduction}")(x, 1)


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
@pytest.mark.parametrize("name", ["offsets", "lengths", "segment_ids"])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_sparse_segment_tensors_are_refused_by_name(name, kind):
    """A sparse torch tensor as offsets, lengths or segment ids: a TypeError naming the argument
    (PyTorch's RuntimeError, or its TypeError of a conversion to NumPy, before)."""
    dense = {"offsets": [0, 3, 6], "lengths": [3, 3], "segment_ids": [0, 0, 0, 1, 1, 1]}[name]
    x = np.arange(6.0) if kind == "numpy" else torch.arange(6.0)
    with pytest.raises(TypeError, match=rf"^{name} is a torch tensor of layout torch.sparse_coo"):
        linred.segmented_sum(x, **{name: torch.tensor(dense).to_sparse()})


@pytest.mark.parametrize("reduction", ["sum", "argmax", "softmax", "logsumexp", "var"])
@pytest.mark.parametrize("remainder", ["keep", "drop"])
@pytest.mark.parametrize("length", [7, 2**40, 2**62, 2**63, 2**70])
def test_a_segment_length_past_the_data(reduction, remainder, length):
    """A segment length longer than the axis with remainder=: one segment of all of it ("keep")
    or none ("drop"), however long (lengths past 2^62 or 2^63 raised OverflowError or NumPy's
    'array is too big')."""
    x = np.arange(6.0)
    fn = getattr(linred, f"segmented_{reduction}")
    got = fn(x, length, remainder=remainder)
    want = fn(x, 6) if remainder == "keep" else fn(x[:0], 1)
    np.testing.assert_array_equal(got, want)


def test_a_segment_length_of_an_array_is_refused_by_name():
    with pytest.raises(TypeError, match=r"^segment_length must be an integer; got ndarray"):
        linred.segmented_sum(np.arange(6.0), np.array([2]))
    with pytest.raises(TypeError, match=r"^segment_length must be an integer; got ndarray"):
        linred.segmented_sum(np.arange(6.0), np.array([2]), remainder="keep")
