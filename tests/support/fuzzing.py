"""Hypothesis settings and strategies the fuzz tests share: JSON-like values, digits examples.

    from support.fuzzing import PROPERTY, JSON_VALUES, near_valid_digits
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# In-process property runs: reproducible and bounded. The autouse fixture in conftest is
# function scoped but only resets placeenv/device state that no example changes.
PROPERTY = settings(
    max_examples=300, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-3, 20)  # near and inside the digits range
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
)
JSON_VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=40,
)

# One digits example: 64 values in [0, 16], ints or floats (flat: the 8x8 nested form is gone).
DIGIT_VALUES = st.lists(st.integers(0, 16) | st.floats(0, 16), min_size=64, max_size=64)
VALID_DIGITS = st.lists(DIGIT_VALUES, min_size=1, max_size=4)


def as_float(leaf) -> float | None:
    """A JSON number (not bool) as the float64 the service reads it as; None for anything else."""
    if type(leaf) not in (int, float):
        return None
    try:
        return float(leaf)
    except OverflowError:  # an int past float64
        return None


def valid_pixel(leaf) -> bool:
    """Whether a JSON value is a pixel the service takes: a number whose float32 is in [0, 16]."""
    value = as_float(leaf)
    with np.errstate(over="ignore"):  # past float32: infinity, as the service casts
        return value is not None and bool(0 <= np.float32(value) <= 16)  # NaN fails


@st.composite
def near_valid_digits(draw):
    """A valid digits batch with one cell replaced by an arbitrary value: (batch, whether still valid)."""
    batch = [list(values) for values in draw(VALID_DIGITS)]
    leaf = draw(LEAVES | st.integers(0, 16) | st.floats(0, 16))  # still valid, often
    batch[draw(st.integers(0, len(batch) - 1))][draw(st.integers(0, 63))] = leaf
    return batch, valid_pixel(leaf)
