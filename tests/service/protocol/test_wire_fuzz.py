"""Tensors on the wire (``protocol/wire.py``), fuzzed: ``wire.from_json`` and ``wire.from_binary`` (JSON
and binary tensors to arrays) on arbitrary values give an array of the datatype or ``InvalidInput``
naming the tensor, never anything else; the fast path agrees with the cell-by-cell one; a long
client tensor name is quoted as a prefix.

Every hypothesis run is derandomized and bounded (max_examples).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from support.fuzzing import JSON_VALUES, PROPERTY

from placeenv.serve.protocol import wire
from placeenv.serve.protocol.errors import InvalidInput
from placeenv.serve.protocol.wire import DATATYPES

KIND = st.sampled_from(sorted(k for k in DATATYPES if k != "BYTES"))  # numbers: BYTES has test_bytes.py
_INTEGER_KINDS = {"UINT8", "INT8", "INT16", "INT32", "INT64"}


def _leaves(data) -> list:
    return [leaf for item in data for leaf in _leaves(item)] if isinstance(data, list) else [data]


def _takes(kind: str, leaf) -> bool:
    """The datatypes' documented leaves: BOOL true/false; integers in range; FP numbers (not bool)."""
    if kind == "BOOL":
        return type(leaf) is bool
    if kind in _INTEGER_KINDS:
        info = np.iinfo(DATATYPES[kind])
        return type(leaf) is int and info.min <= leaf <= info.max
    if type(leaf) is int:
        return abs(leaf) < 2**1024  # what a float64 holds
    return type(leaf) is float


def _from_json_or_error(data, kind, shape=None, tensor="x") -> np.ndarray | None:
    try:
        array = wire.from_json(data, kind, tensor, shape)
    except InvalidInput as exc:  # anything else escapes and fails the test
        message = str(exc)
        assert message and len(message) <= 300, message
        assert f"tensor {tensor!r}" in message, message  # it names the tensor
        return None
    assert isinstance(array, np.ndarray) and array.dtype == DATATYPES[kind]
    return array


@st.composite
def regular_tensors(draw):
    """(nested lists, kind): a regular array of values the kind takes, as JSON would hold them."""
    kind = draw(KIND)
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4))
    if kind == "BOOL":
        elements = st.booleans()
    elif kind in _INTEGER_KINDS:
        info = np.iinfo(DATATYPES[kind])
        elements = st.integers(int(info.min), int(info.max))
    else:
        elements = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**70), 2**70)
    values = draw(st.lists(elements, min_size=math.prod(shape), max_size=math.prod(shape)))
    array = np.empty(shape, dtype=object)
    for i, value in enumerate(values):
        array.flat[i] = value
    return array.tolist(), kind


@given(tensor=regular_tensors())
@PROPERTY
def test_from_json_keeps_every_value_of_a_regular_tensor(tensor):
    data, kind = tensor
    array = _from_json_or_error(data, kind)
    assert array is not None, (data, kind)
    expected = np.array(data, dtype=object)
    assert array.shape == expected.shape
    with np.errstate(over="ignore"):  # FP16/FP32 overflow to infinity, as the service casts
        read_as = np.float64 if kind.startswith("FP") else DATATYPES[kind]
        want = expected.astype(read_as).astype(DATATYPES[kind])
    np.testing.assert_array_equal(array, want)
    # The same values, flat, with the shape given (the v2 form): the same array.
    flat = _from_json_or_error(array.ravel().tolist(), kind, tuple(array.shape)) if array.size else array
    np.testing.assert_array_equal(flat, array)


@given(data=JSON_VALUES, kind=KIND, shape=st.none() | st.lists(st.integers(-2, 5), max_size=4).map(tuple))
@example(data=[[0] * 63 + [2**2000]], kind="FP32", shape=None)  # too large for a float
@example(data=[[10**5000]], kind="INT64", shape=None)  # an int repr() refuses (over 4300 digits)
@example(data=[[[0] * 8] * 7 + [[0] * 7]], kind="FP32", shape=None)  # ragged
@example(data=[[True] * 4], kind="FP32", shape=None)  # bool is not a number here
@example(data=[[1, 0]], kind="BOOL", shape=None)  # nor a number a bool
@example(data=[[[[[[[[[[0]]]]]]]]]], kind="FP64", shape=None)  # too deep
@example(data=[], kind="FP32", shape=(2**62, 2**62, 0))  # a size of 0 numpy cannot shape
@example(data=[], kind="INT8", shape=(0,) * 70)  # over numpy's 64 dimensions
@example(data=[1.5], kind="UINT8", shape=(1,))
@PROPERTY
def test_from_json_on_any_value_gives_an_array_of_the_datatype_or_invalid_input(data, kind, shape):
    array = _from_json_or_error(data, kind, shape)
    if array is None:
        return
    leaves = _leaves(data)
    assert all(_takes(kind, leaf) for leaf in leaves), (data, kind)  # nothing the datatype refuses
    assert array.size == len(leaves)
    if shape is not None:
        assert array.shape == shape


@given(data=JSON_VALUES, kind=KIND)
@example(data=[[2**63 - 1]], kind="INT64")  # exact as int, not as the float64 probe
@example(data=[[2**53 + 1, 1.0]], kind="FP64")
@PROPERTY
def test_the_fast_path_agrees_with_the_cell_by_cell_path(data, kind):
    # fast_array takes vectorised C loops for well-formed data; checked_array walks every value to name a
    # problem. Whenever the fast path answers, the slow one gives the same array.
    assume(isinstance(data, list))
    dtype = DATATYPES[kind]
    fast = wire.fast_array(data, kind, dtype)
    try:
        slow = wire.checked_array(data, kind, dtype, "x")
    except InvalidInput:
        assert fast is None, (data, kind)
        return
    if fast is not None:
        assert fast.dtype == slow.dtype == dtype
        np.testing.assert_array_equal(fast, slow)


@st.composite
def binary_tensors(draw):
    kind = draw(KIND)
    shape = tuple(draw(st.lists(st.integers(-1, 4), max_size=3)))
    itemsize = DATATYPES[kind].itemsize
    if draw(st.booleans()) and all(d >= 0 for d in shape):  # the right number of bytes, half the time
        size = math.prod(shape) * itemsize
        return draw(st.binary(min_size=size, max_size=size)), kind, shape
    return draw(st.binary(max_size=80)), kind, shape


@given(case=binary_tensors())
@example(case=(b"", "FP32", (2**62, 2**62, 0)))
@example(case=(b"\x02", "BOOL", (1,)))
@example(case=(b"\x00" * 8, "FP32", (2, 1)))
@PROPERTY
def test_from_binary_reads_little_endian_values_or_refuses(case):
    buffer, kind, shape = case
    try:
        array = wire.from_binary(memoryview(buffer), kind, "x", shape)
    except InvalidInput as exc:
        assert "tensor 'x'" in str(exc) and len(str(exc)) <= 300
        size = math.prod(shape) * DATATYPES[kind].itemsize if all(d >= 0 for d in shape) else -1
        assert len(buffer) != size or (kind == "BOOL" and max(buffer, default=0) > 1) or size == 0
        return
    assert array.dtype == DATATYPES[kind] and array.shape == shape
    little_endian = DATATYPES[kind].newbyteorder("<")
    np.testing.assert_array_equal(array, np.frombuffer(buffer, little_endian).reshape(shape))
    if kind == "BOOL":
        assert set(buffer) <= {0, 1}


def test_a_long_client_tensor_name_is_quoted_as_a_prefix():
    name = "n" * 100_000
    for run in (lambda: wire.from_json(["a"], "FP32", name),
                lambda: wire.from_binary(b"", "FP32", name, (1,)),
                lambda: wire.from_json([1], "F" * 5000, name)):
        with pytest.raises(InvalidInput) as caught:
            run()
        assert len(str(caught.value)) < 250 and "(100000 characters)" in str(caught.value)
