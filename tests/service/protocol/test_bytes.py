"""BYTES tensors on the wire (``wire.bytes_*``): tritonclient's serialized form read and written
unmodified, JSON strings, and a clear refusal for every hostile case that quotes none of the data."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzzing import JSON_VALUES, PROPERTY
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from placeenv.serve.protocol import wire
from placeenv.serve.protocol.errors import InvalidInput

ELEMENTS = [b"ab", b"", "é".encode(), b"\xff\x00\xfe", b"x" * 300]
SECRET = b"s3cret-token"  # data a refusal must never quote


def tritonclient_bytes(array: np.ndarray) -> bytes:
    """What tritonclient sends for a BYTES tensor (binary data, HTTP or gRPC raw contents)."""
    return serialize_byte_tensor(array).item()


@pytest.mark.parametrize("shape", [(5,), (1, 5), (5, 1, 1)])
def test_tritonclients_serialized_bytes_are_read_unmodified(shape):
    array = np.array(ELEMENTS, dtype=np.object_).reshape(shape)
    found = wire.bytes_from_binary(tritonclient_bytes(array), "x", shape)
    assert found.dtype == np.object_ and found.shape == shape
    assert found.tolist() == array.tolist()


def test_what_the_service_writes_tritonclient_reads_unmodified():
    array = np.array(ELEMENTS + ["text as str"], dtype=np.object_).reshape(2, 3)
    back = deserialize_bytes_tensor(wire.bytes_to_binary(array))
    assert back.tolist() == [*ELEMENTS, b"text as str"]


def test_json_strings_are_the_elements_utf8_bytes_nested_or_flat():
    nested = wire.bytes_from_json([["a", "é"], ["", "ü" * 3]], "x")
    assert nested.shape == (2, 2) and nested.tolist() == [[b"a", "é".encode()], [b"", "ü".encode() * 3]]
    flat = wire.bytes_from_json(["a", "é", "", "üüü"], "x", (2, 2))
    assert flat.tolist() == nested.tolist()
    assert wire.bytes_to_json(nested) == ["a", "é", "", "üüü"]


def test_an_output_that_is_not_text_cannot_be_json():
    with pytest.raises(ValueError):
        wire.bytes_to_json(np.array([b"\xff"], dtype=np.object_))


def _length(n: int) -> bytes:
    return struct.pack("<I", n)


@pytest.mark.parametrize("data, shape, says", [
    (_length(2) + b"ab" + b"\x01\x00", (2,), "element 1 of 2 has no 4-byte length"),  # a length cut short
    (_length(2) + SECRET, (1,), "bytes after its 1 elements"),  # more data than the elements say
    (_length(500) + SECRET, (1,), "element 0 says 500 bytes, past the end of the data"),
    (_length(len(SECRET)) + SECRET, (2,), "element 1 of 2 has no 4-byte length"),
    (b"", (1,), "element 0 of 1 has no 4-byte length"),
    (_length(0) * 1_000_000, (1_000_000,), "1000000 elements; at most"),  # a million empty elements
    (_length(2**31) + SECRET, (1,), "says 2147483648 bytes; at most"),
    (_length(0), (-1,), "dimensions are >= 0"),
])
def test_hostile_binary_bytes_get_a_clear_refusal_that_quotes_no_data(data, shape, says):
    with pytest.raises(InvalidInput, match=says) as refused:
        wire.bytes_from_binary(data, "x", shape)
    assert SECRET.decode() not in str(refused.value) and len(str(refused.value)) < 300


@pytest.mark.parametrize("data, says", [
    ([1, "a"], "has 1 at element 0; expected strings"),
    (["a", ["b"]], "a list where the nesting ends"),
    ([["a"], ["b", "c"]], "ragged"),
    (["\ud800"], "not text"),
    ("a string, not a list", "must be a list"),
    ([""] * (wire.MAX_BYTES_ELEMENTS + 1), "elements; at most"),
    ([[[[[[[[["deep"]]]]]]]]], "nested too deep"),
])
def test_hostile_json_bytes_get_a_clear_refusal(data, says):
    with pytest.raises(InvalidInput, match=says):
        wire.bytes_from_json(data, "x")


@given(data=st.binary(max_size=200), shape=st.lists(st.integers(0, 6), max_size=3).map(tuple))
@PROPERTY
def test_any_binary_data_is_read_or_refused_clearly(data, shape):
    try:
        found = wire.bytes_from_binary(data, "x", shape)
    except InvalidInput:
        return
    assert found.shape == shape and wire.bytes_to_binary(found) == data  # read whole, nothing lost


@given(data=JSON_VALUES)
@PROPERTY
def test_any_json_is_read_as_strings_or_refused_clearly(data):
    try:
        found = wire.bytes_from_json(data, "x")
    except InvalidInput:
        return
    assert all(type(element) is bytes for element in found.flat)
