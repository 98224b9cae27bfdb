"""The bundled models' checks of a request, fuzzed: the service's way (``wire.from_json``, the input's
``TensorSpec.check``, the model's ``preprocess``) on arbitrary values gives a well-formed batch or the
client's error (``InvalidInput``, ``InputError``), never anything else; digits' range check names a
value that is really out of range; mobilenet takes any number.

Every hypothesis run is derandomized and bounded (max_examples).
"""

from __future__ import annotations

import re

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from support.bundled import ENTRIES, checked, template
from support.fuzzing import JSON_VALUES, LEAVES, PROPERTY, VALID_DIGITS, as_float, near_valid_digits

from placeenv.serve.models import InputError
from placeenv.serve.protocol import wire
from placeenv.serve.protocol.errors import InvalidInput

IMAGE = ENTRIES["mobilenet"].default.inputs[0]
DIGITS = template("digits")


@st.composite
def near_valid_mobilenet(draw):
    """A constant 3x32x32 example with one cell replaced: (batch, whether still valid).

    mobilenet (a plain jit.save model) has no value range: any number float64 can hold passes.
    """
    fill = draw(st.floats(-1000, 1000))
    leaf = draw(LEAVES)
    c, h, w = draw(st.integers(0, 2)), draw(st.integers(0, 31)), draw(st.integers(0, 31))
    image = np.full((3, 32, 32), fill).tolist()
    image[c][h][w] = leaf
    return [image], as_float(leaf) is not None


def _checked_or_error(value) -> np.ndarray | None:
    try:
        batch = checked("digits", value)
    except (InvalidInput, InputError) as exc:
        assert str(exc) and len(str(exc)) <= 300, "a refusal says what is wrong, briefly"
        return None
    # Anything else escapes and fails the test.
    assert isinstance(batch, np.ndarray) and batch.dtype == np.float32
    assert batch.shape == (len(value), 64)
    assert np.isfinite(batch).all() and (batch >= 0).all() and (batch <= 1).all()
    return batch


@given(value=JSON_VALUES)
@example(value=[[0] * 63 + [2**2000]])  # too large for a float
@example(value=[[[0] * 8] * 7 + [[0] * 7]])  # ragged
@example(value=[[True] * 64])  # bool is not a number here
@example(value=[[[[[[0]]]]]] * 2)  # too deep
@PROPERTY
def test_digits_validation_of_arbitrary_values_gives_a_batch_or_the_clients_error(value):
    _checked_or_error(value)


@given(case=near_valid_digits())
@settings(PROPERTY, max_examples=150)
def test_digits_with_one_arbitrary_cell(case):
    batch, ok = case
    result = _checked_or_error(batch)
    assert (result is not None) == ok, batch


@given(case=near_valid_mobilenet())
@settings(PROPERTY, max_examples=60)
def test_mobilenet_with_one_arbitrary_cell(case):
    batch, ok = case
    try:
        array = wire.from_json(batch, "FP32", "image")
        IMAGE.check(array)
    except (InvalidInput, InputError):
        assert not ok, batch[0][0][0][:4]
        return
    assert ok and array.shape == (1, 3, 32, 32)


@given(examples=VALID_DIGITS)
@settings(PROPERTY, max_examples=150)
def test_valid_digits_inputs_check_to_the_same_values_scaled(examples):
    batch = checked("digits", examples)
    expected = np.array(examples, dtype=np.float32)
    assert batch.shape == (len(examples), 64) and batch.dtype == np.float32
    np.testing.assert_allclose(batch, expected / 16, rtol=1e-6)


@given(pixels=hnp.arrays(np.float32, st.tuples(st.integers(1, 4), st.just(64)),
                         elements=st.floats(-1, 17, width=32) | st.sampled_from([np.nan, np.inf, -np.inf])))
@PROPERTY
def test_the_digits_range_check_names_a_value_that_is_really_out_of_range(pixels):
    in_range = bool(((pixels >= 0) & (pixels <= 16)).all())  # NaN is not
    try:
        out = DIGITS.preprocess({"pixels": pixels})["pixels"]
    except InputError as exc:
        assert not in_range
        found = re.search(r"has value (\S+) at position \[(\d+), (\d+)\]; expected pixels in \[0, 16\]",
                          str(exc))
        assert found, str(exc)
        value = pixels[int(found[2]), int(found[3])]
        assert not 0 <= value <= 16 and f"{value:g}" == found[1]
        return
    assert in_range
    np.testing.assert_allclose(out, pixels / 16, rtol=1e-6)
