"""Segment specifications: fixed length, offsets or lengths, parsed and validated.

A call names its segments in exactly one of three ways; all become either
:class:`FixedSegments` (no offsets array is ever built for them) or
:class:`VariableSegments` (CSR-style offsets on the data's device).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, NoReturn

from linred.arrays import ArrayAdapter


@dataclass(frozen=True, slots=True)
class FixedSegments:
    """``count`` segments of ``length`` elements each."""

    length: int
    count: int

    @property
    def key(self) -> tuple:
        return ("fixed", self.length)


@dataclass(slots=True)
class VariableSegments:
    """Segments ``[offsets[i], offsets[i + 1])``; ``offsets`` is 1-D int32/int64 on the data's device.

    ``max_length`` and ``min_length`` are known when the offsets were checked on the
    host (``check=True``), else None (a check on a device learns only whether they
    are valid).  ``word`` is nonzero for offsets still to be checked by the executor
    that reads them (``check=True`` on a device, with an executor whose
    ``checks_offsets`` is set): the address of the pinned host word its kernel sets
    when a rule is broken, read after the call (:func:`parse_offsets`).  (Not frozen:
    one is made per call with offsets, and a frozen dataclass takes twice as long to
    make; nothing changes one.)
    """

    offsets: Any
    count: int
    max_length: int | None = None
    min_length: int | None = None
    word: int = 0

    @property
    def key(self) -> tuple:
        return ("variable", self.count, _index_dtype_name(self.offsets.dtype))


Segments = FixedSegments | VariableSegments

_names: dict[Any, str] = {}


def _index_dtype_name(dtype: Any) -> str:
    """``"int32"`` or ``"int64"`` for a NumPy, CuPy or torch index dtype (remembered per dtype)."""
    name = _names.get(dtype)
    if name is None:
        name = _names[dtype] = str(dtype).removeprefix("torch.")
    return name


def segment_length_value(value: Any) -> int:
    """``segment_length`` as an int ``>= 1``, or the TypeError or ValueError that names it."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"segment_length must be an integer; got {type(value).__name__} {value!r}")
    try:
        length = operator.index(value)
    except TypeError:  # (an array of one integer has __index__, which refuses it)
        raise TypeError(f"segment_length must be an integer; got {type(value).__name__} {value!r}") from None
    if length < 1:
        raise ValueError(f"segment_length must be >= 1; got {length}")
    return length


def _segment_length(value: Any, n: int, axis: int) -> FixedSegments:
    length = segment_length_value(value)
    if n % length:
        raise ValueError(
            f"segment_length={length} does not divide the length of axis {axis} (n={n}); "
            "remainder='drop' leaves out the last n % segment_length elements, remainder='keep' makes them a "
            "last, shorter segment"
        )
    return FixedSegments(length, n // length)


def _one_dimensional(a: Any, name: str) -> None:
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D; got shape {tuple(a.shape)}")


def _refuse_capture(adapter: ArrayAdapter, a: Any, name: str) -> None:
    """Checking segments reads their summary back on the host, which a CUDA graph capture cannot do."""
    if adapter.capturing(a):
        raise RuntimeError(
            f"checking {name} (check=True) reads them back on the host, which cannot happen while a CUDA "
            "graph is being captured; pass check=False inside the capture (and check them before it)"
        )


def parse_offsets(
    value: Any,
    n: int,
    axis: int,
    adapter: ArrayAdapter,
    device: int | None,
    check: bool,
    deferred: bool = False,
) -> VariableSegments:
    """``offsets=`` of a call on an axis of length ``n``, as segments on ``device`` (checked if ``check``).

    With ``deferred`` (the kernel that will read them checks them too: a plan's executor
    whose ``checks_offsets`` is set, or the softmax family's kernel), offsets on a device
    are not checked here: the segments carry the ``word`` that kernel sets, and the caller
    passes them to :func:`verify` after the call.
    """
    off = adapter.index_array(value, device, "offsets")
    _one_dimensional(off, "offsets")
    if off.shape[0] == 0:
        raise ValueError("offsets must have at least one element (offsets[0] == 0); got an empty array")
    count = off.shape[0] - 1
    if not check:
        return VariableSegments(off, count)
    _refuse_capture(adapter, off, "offsets")
    if deferred and count:
        word = adapter.check_word(off)
        if word:
            return VariableSegments(off, count, word=word)
    if adapter.offsets_ok(off, n):  # on a device: one pass, one word read back
        return VariableSegments(off, count)
    return _explain_offsets(adapter, off, n, axis)


def _explain_offsets(adapter: ArrayAdapter, off: Any, n: int, axis: int) -> VariableSegments:
    """Checked offsets ``off`` (their extremes learnt), or the ValueError that names the rule
    they break and where."""
    first, last, at, lo, hi = adapter.offsets_summary(off)  # on the host, or to say what broke
    if first != 0:
        raise ValueError(f"offsets[0] must be 0; got {first}")
    if at >= 0:
        before, after = adapter.value_at(off, at), adapter.value_at(off, at + 1)
        raise ValueError(f"offsets must be non-decreasing: offsets[{at + 1}]={after} < offsets[{at}]={before}")
    if last != n:
        raise ValueError(f"offsets[-1] must equal the length of axis {axis} (n={n}); got {last}")
    count = off.shape[0] - 1
    return VariableSegments(off, count, hi, lo if count else None)


def parse_lengths(
    value: Any,
    n: int,
    axis: int,
    adapter: ArrayAdapter,
    device: int | None,
    check: bool,
    deferred: bool = False,
) -> VariableSegments:
    """``lengths=`` of a call on an axis of length ``n``, as offsets on ``device`` (checked if
    ``check``; ``deferred`` as in :func:`parse_offsets`)."""
    lengths = adapter.index_array(value, device, "lengths")
    _one_dimensional(lengths, "lengths")
    off = adapter.lengths_to_offsets(lengths)
    if not check:
        return VariableSegments(off, lengths.shape[0])
    _refuse_capture(adapter, lengths, "lengths")
    # Non-negative lengths that sum to n without wrapping around are offsets that never
    # decrease and end at n: on a device, the offsets' check is the lengths'.  (Lengths
    # that wrap past the int64 range make offsets that decrease where they wrap.)
    if deferred and lengths.shape[0]:
        word = adapter.check_word(off)
        if word:
            return VariableSegments(off, lengths.shape[0], word=word)
    if adapter.offsets_ok(off, n):
        return VariableSegments(off, lengths.shape[0])
    return _explain_lengths(adapter, lengths, off, n, axis)


def _explain_lengths(adapter: ArrayAdapter, lengths: Any, off: Any, n: int, axis: int) -> VariableSegments:
    """Checked ``lengths`` as offsets ``off``, or the ValueError that names the rule they break."""
    lo, at, hi, wrapped, total = adapter.lengths_summary(lengths, off)
    if lo < 0:
        raise ValueError(f"lengths must be non-negative: lengths[{at}]={lo}")
    if wrapped:
        raise ValueError(
            f"lengths must sum to the length of axis {axis} (n={n}); their sum exceeds the int64 range "
            f"(the largest is {hi})"
        )
    if total != n:
        raise ValueError(f"lengths must sum to the length of axis {axis} (n={n}); got {total}")
    return VariableSegments(off, lengths.shape[0], hi, lo if lengths.shape[0] else None)


def verify(
    segments: VariableSegments,
    adapter: ArrayAdapter,
    stream: Any,
    lengths: Any,
    *,
    n: int,
    axis: int,
    device: int | None,
) -> None:
    """After a call whose executor checked ``segments`` (a nonzero ``word``): wait for
    ``stream`` once and raise the ValueError of the rule the offsets break, if one is
    (the message names the offending index and values, as a check before the call does).

    ``lengths`` is the call's ``lengths=`` as given (None for ``offsets=``): the message
    then names the lengths.
    """
    if not adapter.check_passed(stream, device):
        explain(segments, adapter, lengths, n=n, axis=axis, device=device)


def explain(segments: VariableSegments, adapter: ArrayAdapter, lengths: Any, *, n: int, axis: int,
            device: int | None) -> NoReturn:  # fmt: skip
    """The ValueError of the rule that ``segments``' offsets break, which the kernel that read
    them reported (arguments as in :func:`verify`)."""
    if lengths is None:
        _explain_offsets(adapter, segments.offsets, n, axis)
    else:
        _explain_lengths(adapter, adapter.index_array(lengths, device, "lengths"), segments.offsets, n, axis)
    raise RuntimeError(  # pragma: no cover (a kernel and the host disagree: a defect of linred's)
        "the offsets check of the kernel that read them failed, but the offsets are valid; please report this"
    )


def parse_segments(
    segment_length: Any,
    offsets: Any,
    lengths: Any,
    *,
    n: int,
    axis: int,
    adapter: ArrayAdapter,
    device: int | None,
    check: bool,
) -> Segments:
    """Validate the segment arguments of a call and return its segments.

    Raises
    ------
    TypeError, ValueError
        With a message naming the argument, the rule and the offending value.
    """
    given = [
        name
        for name, v in (("segment_length", segment_length), ("offsets", offsets), ("lengths", lengths))
        if v is not None
    ]
    if len(given) != 1:
        got = " and ".join(given) if given else "none (the functions also take segment_ids)"
        raise TypeError(f"exactly one of segment_length, offsets or lengths must be given; got {got}")
    if segment_length is not None:
        return _segment_length(segment_length, n, axis)
    if offsets is not None:
        return parse_offsets(offsets, n, axis, adapter, device, check)
    return parse_lengths(lengths, n, axis, adapter, device, check)
