"""Device names as the engine reads them (``PLACEENV_DEVICES``, through ``placeenv.to_place`` and
``placeenv.device_name``), fuzzed: any string or int is an available device or a ``ValueError``
naming the available ones; every valid spelling gives the canonical name.

Every hypothesis run is derandomized and bounded (max_examples).
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from support.fuzzing import PROPERTY

import placeenv

AVAILABLE = "available devices: cpu, sim:0, sim:1, sim:2, sim:3"
DEVICES = {"cpu", "sim:0", "sim:1", "sim:2", "sim:3"}
WHITESPACE = st.text(alphabet=" \t\n\u00a0\u2003", max_size=2)
KINDS = st.sampled_from(
    ["cpu", "CPU", "Cpu", "sim", "SIM", "Sim", "gpu", "cuda", "xpu", "dcu", "npu", "custom", ""]
)
INDICES = st.one_of(
    st.just(""), st.integers(-2, 9).map(str), st.integers().map(str), st.text("0123456789", max_size=6),
    st.text(max_size=3),
)


@st.composite
def device_like_strings(draw):
    separator = draw(st.sampled_from(["", ":", ":", "::", "-", "/"]))
    parts = [draw(WHITESPACE), draw(KINDS | st.text(max_size=5)), draw(WHITESPACE),
             separator, draw(WHITESPACE), draw(INDICES), draw(WHITESPACE)]
    return "".join(parts)


def _show(device) -> str:
    # repr() of an int over 4300 digits raises ValueError itself.
    return f"<int of {device.bit_length()} bits>" if type(device) is int else repr(device)


def _check_device(device) -> str | None:
    try:
        place = placeenv.to_place(device)
    except ValueError as exc:
        assert AVAILABLE in str(exc), f"{_show(device)}: {exc}"
        return None
    name = placeenv.device_name(place)
    assert name in placeenv.available_devices() and name in DEVICES, (_show(device), name)
    return name


@given(device=st.one_of(device_like_strings(), st.text(), st.integers(), st.integers(-5, 8)))
@PROPERTY
def test_to_place_returns_an_available_device_or_a_value_error_naming_them(device):
    # Any other exception type escapes and fails the test.
    _check_device(device)


@st.composite
def valid_device_spellings(draw):
    """(spelling, canonical name) for devices that exist here."""
    pad = WHITESPACE
    if draw(st.booleans()):
        kind = draw(st.sampled_from(["cpu", "CPU", "Cpu", "cPU"]))
        index = draw(st.sampled_from(["", ":0", ": 0", " :00"]))
        return f"{draw(pad)}{kind}{draw(pad)}{index}{draw(pad)}", "cpu"
    n = draw(st.integers(0, 3))
    zeros = "0" * draw(st.integers(0, 2))
    return f"{draw(pad)}sim{draw(pad)}:{draw(pad)}{zeros}{n}{draw(pad)}", f"sim:{n}"


@given(spelling=valid_device_spellings())
@example(spelling=(" sim : 2 ", "sim:2"))
@example(spelling=("CPU", "cpu"))
@PROPERTY
def test_valid_device_names_round_trip_to_the_canonical_name(spelling):
    text, canonical = spelling
    assert placeenv.device_name(placeenv.to_place(text)) == canonical
    assert placeenv.device_name(placeenv.to_place(canonical)) == canonical


@pytest.mark.parametrize("n", range(4))
def test_int_device_is_the_nth_sim_device(n):
    assert placeenv.device_name(placeenv.to_place(n)) == f"sim:{n}"


def test_device_index_with_more_than_4300_digits():
    _check_device("sim:" + "1" * 5000)


def test_huge_int_device():
    _check_device(10**5000)
