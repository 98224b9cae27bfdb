"""Fuzzing: schemathesis against the live service's own OpenAPI; hypothesis on parsing and validation.

* HTTP, schema-driven: schemathesis generates valid and invalid requests for every
  operation in the running service's ``/openapi.json`` and runs its conformance
  checks, plus two of ours: no 5xx at all, and every 4xx explains itself in a JSON
  ``detail``.
* HTTP, input-driven: hypothesis sends arbitrary JSON values (NaN, Infinity, huge
  integers, lone surrogates included) as a digits request's ``inputs`` and as the
  whole body; the answer must be the one the in-process validator predicts.
* In-process: ``placeenv.to_place`` on arbitrary device strings and ints, and the
  models' ``validate`` on arbitrary JSON-like values: either a well-formed result
  or the one documented error type, never anything else.

Every hypothesis run is derandomized and bounded (max_examples), so the file is
reproducible and takes well under a minute and a half.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import positive_data_acceptance

import placeenv
from placeenv.serve.models import registry
from placeenv.serve.models.base import InputError
from servers import ServiceProcess

AVAILABLE = "available devices: cpu, sim:0, sim:1, sim:2, sim:3"
DEVICES = {"cpu", "sim:0", "sim:1", "sim:2", "sim:3"}

# In-process property runs: reproducible and bounded. The autouse fixture in conftest is
# function scoped but only resets placeenv/device state that no example changes.
PROPERTY = settings(
    max_examples=300, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

# ---------------------------------------------------------------------------------------------
# Strategies: JSON-like values
# ---------------------------------------------------------------------------------------------

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

# Over HTTP, strings may also carry lone surrogates: JSON's "\ud800" escape decodes to one.
SURROGATES = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"])
WIRE_TEXT = st.text(alphabet=st.characters() | SURROGATES, max_size=6)
# Values strict JSON cannot hold but Python's json reads (NaN, Infinity, lone surrogates), often.
AWKWARD = st.sampled_from([float("nan"), float("inf"), float("-inf"), "\ud800", "x\udfff", 2**70])
WIRE_LEAVES = (
    st.none() | st.booleans() | st.integers() | st.integers(-3, 20)
    | st.floats(allow_nan=True, allow_infinity=True) | WIRE_TEXT | AWKWARD
)
WIRE_VALUES = st.recursive(
    WIRE_LEAVES, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(WIRE_TEXT, inner, max_size=3),
    max_leaves=40,
)


def _digit_example(values: list, square: bool) -> list:
    return [values[r * 8:(r + 1) * 8] for r in range(8)] if square else values


# One digits example: 64 values in [0, 16], ints or floats, flat or 8x8.
DIGIT_VALUES = st.lists(st.integers(0, 16) | st.floats(0, 16), min_size=64, max_size=64)
DIGIT_EXAMPLES = st.tuples(DIGIT_VALUES, st.booleans())
VALID_DIGITS = st.lists(DIGIT_EXAMPLES, min_size=1, max_size=4)


@st.composite
def near_valid_digits(draw):
    """A valid digits batch with one cell replaced by an arbitrary value: (batch, whether still valid)."""
    batch = draw(VALID_DIGITS)
    leaf = draw(LEAVES)
    which = draw(st.integers(0, len(batch) - 1))
    cell = draw(st.integers(0, 63))
    values, square = batch[which]
    values = list(values)
    values[cell] = leaf
    batch[which] = (values, square)
    ok = type(leaf) in (int, float) and 0 <= leaf <= 16  # NaN and +-inf fail the comparison
    return [_digit_example(v, s) for v, s in batch], ok


@st.composite
def near_valid_mobilenet(draw):
    """A constant 3x32x32 example with one cell replaced: (batch, whether still valid)."""
    fill = draw(st.floats(-1000, 1000))
    leaf = draw(LEAVES)
    c, h, w = draw(st.integers(0, 2)), draw(st.integers(0, 31)), draw(st.integers(0, 31))
    image = np.full((3, 32, 32), fill).tolist()
    image[c][h][w] = leaf
    ok = type(leaf) in (int, float) and -1000 <= leaf <= 1000
    return [image], ok


# ---------------------------------------------------------------------------------------------
# HTTP: schemathesis against the running service
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzzed_service():
    # Defaults: 4 sim devices x 2 workers, models=digits, default queue. Fuzz traffic is
    # sequential, so nothing may ever be overloaded: a 503 here is a failure like any 5xx.
    with ServiceProcess(MODELS="digits") as proc:
        yield proc
        assert proc.proc.poll() is None, f"the service died during fuzzing:\n{proc.proc.output()[-6000:]}"


@pytest.fixture(scope="module")
def api_schema(fuzzed_service):
    # The schema the running service itself serves, not one built in-process.
    return schemathesis.openapi.from_url(fuzzed_service.url + "/openapi.json", timeout=30)


@pytest.fixture(autouse=True)
def _schemathesis_pytest9_nodeid(request):
    # schemathesis 4.32's from_fixture tests read and write ``node._nodeid``, an attribute
    # pytest 9 no longer has; provide it (it only labels the per-operation subtests).
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


schema = schemathesis.pytest.from_fixture("api_schema")


def _detail_problem(status: int, text: str, content_type: str) -> str | None:
    """Why a 4xx body fails to explain itself, or None: JSON object with a non-empty str/list detail."""
    if not content_type.startswith("application/json"):
        return f"{status} with content-type {content_type!r}: {text[:200]!r}"
    try:
        body = json.loads(text)
    except ValueError:
        return f"{status} body is not JSON: {text[:200]!r}"
    detail = body.get("detail") if isinstance(body, dict) else None
    # The service's own errors say it in a string; FastAPI's request validation (422) lists them.
    if not (isinstance(detail, (str, list)) and detail):
        return f"{status} without a non-empty detail: {text[:200]!r}"
    return None


def no_5xx(ctx, response, case):
    """Not even 503/504: sequential fuzz traffic must never overload or time out the service."""
    assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
    return None


def four_xx_has_detail(ctx, response, case):
    if 400 <= response.status_code < 500:
        content_type = response.headers.get("content-type", [""])[0]
        problem = _detail_problem(response.status_code, response.text, content_type)
        assert problem is None, problem
    return None


@schema.parametrize()
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_openapi_fuzz_no_5xx_and_every_4xx_explains_itself(case, fuzzed_service):
    # All of schemathesis's default checks (status code documented, content type and body
    # match the documented schema, headers, negative data rejected, unsupported methods
    # answered 405, ...) except ``positive_data_acceptance``: the schema can only say
    # "inputs is a list" -- shapes and ranges depend on the model named in the same body --
    # so a schema-valid {"model": "digits", "inputs": [{}]} is rightly a 422 with a message.
    try:
        case.call_and_validate(
            timeout=30,
            additional_checks=[no_5xx, four_xx_has_detail],
            excluded_checks=[positive_data_acceptance],
        )
    except requests.ConnectionError:
        if fuzzed_service.proc.poll() is not None:
            pytest.fail(f"the service died:\n{fuzzed_service.proc.output()[-6000:]}")
        raise


# ---------------------------------------------------------------------------------------------
# HTTP: arbitrary inputs, checked against the in-process validator
# ---------------------------------------------------------------------------------------------


def _expected_status(body) -> int:
    """What the service must answer for a JSON body, from the in-process validator."""
    if not isinstance(body, dict) or set(body) != {"model", "inputs"}:
        return 422
    model, inputs = body["model"], body["inputs"]
    if not isinstance(model, str) or not isinstance(inputs, list):
        return 422
    if model != "digits":
        return 404
    if len(inputs) > 32:
        return 422
    try:
        registry.create("digits").validate(inputs)
    except InputError:
        return 422
    return 200


@st.composite
def wire_bodies(draw):
    kind = draw(st.sampled_from(["inputs", "near_valid", "fields", "body"]))
    if kind == "inputs":  # the service's own validation
        return {"model": "digits", "inputs": draw(WIRE_VALUES)}
    if kind == "near_valid":  # deep in it: one bad cell in a good batch
        return {"model": "digits", "inputs": draw(near_valid_digits())[0]}
    if kind == "fields":  # FastAPI's schema validation, which echoes the bad value
        model = draw(st.sampled_from(["digits", "resnet"]) | WIRE_VALUES)
        body = {"model": model, "inputs": draw(WIRE_VALUES)}
        if draw(st.booleans()):
            body[draw(WIRE_TEXT)] = draw(WIRE_VALUES)
        return body
    return draw(WIRE_VALUES)  # any JSON at all as the body


@given(body=wire_bodies())
@example(body={"model": "digits", "inputs": "\ud800"})  # 422 echoing a lone surrogate (was a 500)
@example(body={"model": float("nan"), "inputs": [[1]]})  # 422 echoing NaN (was a 500)
@example(body={"model": "digits", "inputs": [[1] * 64], "\udfff": float("inf")})
@example(body={"model": "digits", "inputs": [[2**80] * 64]})
# No shrinking: each shrink step is a request, and a failing run should report fast.
@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
def test_predict_arbitrary_json_gets_the_validators_answer(fuzzed_service, body):
    # json.dumps writes NaN/Infinity and escapes surrogates: what Python clients really send.
    content = json.dumps(body)
    r = httpx.post(fuzzed_service.url + "/predict", content=content,
                   headers={"content-type": "application/json"}, timeout=30)
    expected = _expected_status(body)
    assert r.status_code == expected, (content[:300], r.status_code, r.text[:300],
                                       fuzzed_service.output()[-3000:])
    if r.status_code == 200:
        assert len(r.json()["outputs"]) == len(body["inputs"])
    else:
        problem = _detail_problem(r.status_code, r.text, r.headers.get("content-type", ""))
        assert problem is None, problem


# ---------------------------------------------------------------------------------------------
# In-process: device strings
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# In-process: request validation
# ---------------------------------------------------------------------------------------------


def _validate_or_input_error(name: str, value) -> np.ndarray | None:
    model = registry.create(name)
    try:
        batch = model.validate(value)
    except InputError as exc:
        assert str(exc), "an InputError must say what is wrong"
        return None
    # Anything but InputError escapes and fails the test.
    low, high = model.value_range
    assert isinstance(batch, np.ndarray) and batch.dtype == np.float32
    assert batch.shape == (len(value), *model.input_shape)
    assert np.isfinite(batch).all() and (batch >= low).all() and (batch <= high).all()
    return batch


@given(value=JSON_VALUES)
@example(value=[[0] * 63 + [2**2000]])  # too large for a float
@example(value=[[[0] * 8] * 7 + [[0] * 7]])  # ragged
@example(value=[[True] * 64])  # bool is not a number here
@example(value=[[[[[[0]]]]]] * 2)  # too deep
@PROPERTY
def test_validate_arbitrary_values_gives_a_batch_or_input_error(value):
    for name in ("digits", "mobilenet"):
        _validate_or_input_error(name, value)


@given(case=near_valid_digits())
@settings(PROPERTY, max_examples=150)
def test_validate_digits_with_one_arbitrary_cell(case):
    batch, ok = case
    result = _validate_or_input_error("digits", batch)
    assert (result is not None) == ok, batch


@given(case=near_valid_mobilenet())
@settings(PROPERTY, max_examples=60)
def test_validate_mobilenet_with_one_arbitrary_cell(case):
    batch, ok = case
    result = _validate_or_input_error("mobilenet", batch)
    assert (result is not None) == ok


@given(examples=VALID_DIGITS)
@settings(PROPERTY, max_examples=150)
def test_valid_digits_inputs_validate_to_the_same_values(examples):
    model = registry.create("digits")
    sent = [_digit_example(values, square) for values, square in examples]
    batch = model.validate(sent)
    expected = np.array([values for values, _ in examples], dtype=np.float32)
    assert batch.shape == (len(examples), 64) and batch.dtype == np.float32
    np.testing.assert_array_equal(batch, expected)
    # preprocess: the same values scaled to [0, 1], on the CPU whatever the thread's device (sim:0 here)
    tensor = model.preprocess(sent)
    assert placeenv.device_name(tensor.place) == "cpu"
    np.testing.assert_allclose(tensor.numpy(), expected / 16, rtol=1e-6)


def _outcome(run):
    try:
        return run()
    except InputError as exc:
        return f"InputError: {exc}"


@given(case=near_valid_digits(), mobilenet_case=near_valid_mobilenet())
@settings(PROPERTY, max_examples=150)
def test_fast_validation_path_agrees_with_the_cell_by_cell_path(case, mobilenet_case):
    # _example takes a vectorised path for well-formed examples; _diagnose is the
    # cell-by-cell path that names problems. Same value or same error, always.
    for name, (batch, _) in (("digits", case), ("mobilenet", mobilenet_case)):
        model = registry.create(name)
        for example in batch:
            fast = _outcome(lambda: model._example(0, example))
            slow = _outcome(lambda: model._diagnose(0, example))
            if isinstance(slow, str):
                assert fast == slow
            else:
                np.testing.assert_array_equal(fast, slow)
                assert fast.dtype == slow.dtype == np.float32
