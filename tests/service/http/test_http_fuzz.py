"""The HTTP endpoints, fuzzed: schemathesis against the live service's own OpenAPI, hypothesis on its
request bodies.

* Schema-driven: schemathesis generates valid and invalid requests for every
  operation in the running service's ``/openapi.json`` (``/predict``, ``/v2``, the
  operational endpoints) and runs its conformance checks, plus two of ours: no 5xx at
  all, and every 4xx explains itself in a JSON ``detail`` (``error`` under ``/v2``).
* Input-driven: hypothesis sends arbitrary JSON values (NaN, Infinity, huge
  integers, lone surrogates included) as a digits ``/predict`` request and as the whole
  body, and mutated Open Inference Protocol requests (JSON and binary tensors) to
  ``/v2/models/digits/infer``; the status must be the one the in-process validator (or
  the mutation) predicts, and every refusal is short: it quotes at most a short prefix
  of anything the client sent.

Every hypothesis run is derandomized and bounded (max_examples), so the file is
reproducible and takes under a minute here.
"""

from __future__ import annotations

import json
import urllib.parse

import httpx
import numpy as np
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, assume, event, example, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import positive_data_acceptance
from support.bundled import checked
from support.fuzzing import DIGIT_VALUES, near_valid_digits, valid_pixel

from placeenv.serve.protocol.errors import InvalidInput
from placeenv.serve.models import DATATYPES, InputError
from placeenv.serve.http.responses import PADDLEX_PATHS

BODY_LIMIT = 1024 * 1024
MAX_EXAMPLES = 32  # the service's default max_examples_per_request
ECHO = 41  # an echo quotes at most 40 characters of what the client sent (wire.prefix)

# Over HTTP: each example is a request; no shrinking (each step is one), so a failure reports fast.
WIRE = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.reuse, Phase.generate])


def client_strings(value) -> list[str]:
    """Every string in a JSON-like value, keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [*client_strings(k), *client_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in client_strings(v)]
    return []


def text_of(value) -> str:
    """The strings of a decoded answer, joined: what a reader of the message sees."""
    return "\n".join(client_strings(value))


def refusal_problem(response: httpx.Response, key: str, sent: list[str]) -> str | None:
    """Why an error answer is not a short JSON explanation quoting at most a prefix of ``sent``; or None."""
    if not response.headers.get("content-type", "").startswith("application/json"):
        return f"{response.status_code} with content-type {response.headers.get('content-type')!r}"
    if len(response.content) > 4000:
        return f"{response.status_code} answer of {len(response.content)} bytes: {response.text[:300]!r}"
    try:
        body = response.json()
    except ValueError:
        return f"{response.status_code} body is not JSON: {response.text[:200]!r}"
    message = body.get(key) if isinstance(body, dict) else None
    # The service's own errors say it in a string; FastAPI's request validation (422) lists them.
    if not (isinstance(message, (str, list)) and message):
        return f"{response.status_code} without a non-empty {key!r}: {response.text[:200]!r}"
    shown = text_of(body)
    for s in sent:
        if len(s) >= ECHO and s[:ECHO] in shown:
            return f"{response.status_code} echoes {len(s)} characters the client sent: {shown[:300]!r}"
    return None


# Over HTTP, strings may also carry lone surrogates: JSON's "\ud800" escape decodes to one.
SURROGATES = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"])
WIRE_TEXT = st.text(alphabet=st.characters() | SURROGATES, max_size=6)
LONG_TEXT = st.text(alphabet=st.characters() | SURROGATES, min_size=ECHO, max_size=300)
# Values strict JSON cannot hold but Python's json reads (NaN, Infinity, lone surrogates), often.
AWKWARD = st.sampled_from([float("nan"), float("inf"), float("-inf"), "\ud800", "x\udfff", 2**70])
WIRE_LEAVES = (
    st.none() | st.booleans() | st.integers() | st.integers(-3, 20)
    | st.floats(allow_nan=True, allow_infinity=True) | WIRE_TEXT | AWKWARD | LONG_TEXT
)
WIRE_VALUES = st.recursive(
    WIRE_LEAVES, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(WIRE_TEXT, inner, max_size=3),
    max_leaves=40,
)


# ---------------------------------------------------------------------------------------------
# HTTP: schemathesis against the running service
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def service_settings():
    # 4 sim devices x 2 workers, digits only, default queue, a 1 MiB body limit. Fuzz traffic
    # is sequential, so nothing may ever be overloaded: a 503 here is a failure like any 5xx.
    # The service fixture checks that it is still running after the fuzzing.
    return {"MODELS": "digits", "MAX_BODY_BYTES": BODY_LIMIT}


@pytest.fixture(scope="module")
def api_schema(service):
    # The schema the running service itself serves, not one built in-process.
    return schemathesis.openapi.from_url(service.url + "/openapi.json", timeout=30)


@pytest.fixture(autouse=True)
def _schemathesis_pytest9_nodeid(request):
    # schemathesis 4.32's from_fixture tests read and write ``node._nodeid``, an attribute
    # pytest 9 no longer has; provide it (it only labels the per-operation subtests).
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


schema = schemathesis.pytest.from_fixture("api_schema")


def _error_key(path: str) -> str:
    """Where each API says what is wrong: v2's "error", PaddleX serving's "errorMsg", else "detail"."""
    return "error" if path.startswith("/v2") else "errorMsg" if path in PADDLEX_PATHS else "detail"


def no_5xx(ctx, response, case):
    """Not even 503/504: sequential fuzz traffic must never overload or time out the service."""
    assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"


def four_xx_explains_itself(ctx, response, case):
    if 400 <= response.status_code < 500:
        path = case.operation.path
        content_type = response.headers.get("content-type", [""])[0]
        if not content_type.startswith("application/json"):
            raise AssertionError(f"{response.status_code} with content-type {content_type!r}")
        body = json.loads(response.text)
        key = _error_key(path)
        message = body.get(key) if isinstance(body, dict) else None
        assert isinstance(message, (str, list)) and message, f"{response.status_code} without {key!r}: {body}"
        assert len(response.text) <= 4000, f"{response.status_code} answer of {len(response.text)} characters"


@schema.parametrize()
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_openapi_fuzz_no_5xx_and_every_4xx_explains_itself(case, service):
    # All of schemathesis's default checks (status code documented, content type and body
    # match the documented schema, headers, negative data rejected, unsupported methods
    # answered 405, ...) except ``positive_data_acceptance``: the schema can only say
    # "inputs is a list" -- shapes and ranges depend on the model named in the same body --
    # so a schema-valid {"model": "digits", "inputs": [{}]} is rightly a 400 with a message.
    try:
        case.call_and_validate(
            timeout=30,
            additional_checks=[no_5xx, four_xx_explains_itself],
            excluded_checks=[positive_data_acceptance],
        )
    except requests.ConnectionError:
        if service.proc.poll() is not None:
            pytest.fail(f"the service died:\n{service.output()[-6000:]}")
        raise


# ---------------------------------------------------------------------------------------------
# HTTP: /predict with arbitrary inputs, checked against the in-process validator
# ---------------------------------------------------------------------------------------------


def _expected_predict(body) -> int:
    """What the service must answer for a JSON body: /predict's schema (422), the model (404),
    then the in-process validator (400)."""
    if not isinstance(body, dict) or not {"model", "inputs"} <= set(body) <= {"model", "version", "inputs"}:
        return 422
    model, inputs, version = body["model"], body["inputs"], body.get("version")
    if not isinstance(model, str) or not (
        isinstance(inputs, list)
        or (isinstance(inputs, dict) and all(isinstance(v, list) for v in inputs.values()))
    ):
        return 422
    if version not in (None, 1, 2):
        return 422  # the generator sends only these, and strings that are not numbers
    if model != "digits" or version == 2:
        return 404
    if isinstance(inputs, dict):
        if set(inputs) != {"pixels"}:
            return 400  # an unknown input, or pixels missing
        inputs = inputs["pixels"]
    if not inputs or len(inputs) > MAX_EXAMPLES:
        return 400
    try:
        checked("digits", inputs)
    except (InvalidInput, InputError):
        return 400
    return 200


@st.composite
def predict_bodies(draw):
    kind = draw(st.sampled_from(["inputs", "near_valid", "by_name", "version", "fields", "body"]))
    if kind == "inputs":  # the service's own validation
        return {"model": "digits", "inputs": draw(WIRE_VALUES)}
    if kind == "near_valid":  # deep in it: one bad cell in a good batch
        return {"model": "digits", "inputs": draw(near_valid_digits())[0]}
    if kind == "by_name":  # {input name: examples}, the form for models of several inputs
        inputs = {"pixels": draw(near_valid_digits())[0]}
        if draw(st.booleans()):
            inputs[draw(WIRE_TEXT | LONG_TEXT)] = draw(WIRE_VALUES)
        return {"model": "digits", "inputs": inputs}
    if kind == "version":
        version = draw(st.sampled_from([1, 2, None, "one"]))
        return {"model": "digits", "version": version, "inputs": draw(near_valid_digits())[0]}
    if kind == "fields":  # FastAPI's schema validation, which echoes the bad value (cut to a prefix)
        model = draw(st.sampled_from(["digits", "resnet"]) | WIRE_VALUES | LONG_TEXT)
        body = {"model": model, "inputs": draw(WIRE_VALUES)}
        if draw(st.booleans()):
            body[draw(WIRE_TEXT | LONG_TEXT)] = draw(WIRE_VALUES)
        return body
    return draw(WIRE_VALUES)  # any JSON at all as the body


@given(body=predict_bodies())
@example(body={"model": "digits", "inputs": "\ud800"})  # 422 quoting a lone surrogate, escaped
@example(body={"model": float("nan"), "inputs": [[1]]})  # 422 quoting NaN, as a string
@example(body={"model": "digits", "inputs": [[1] * 64], "\udfff": float("inf")})
@example(body={"model": "digits", "inputs": [[2**80] * 64]})
@example(body={"model": "digits", "inputs": [[0] * 8] * 8})  # the old 8x8 form: now a 400
@example(body={"model": "m" * 200_000, "inputs": [[1]]})  # a 200 KB name: 404 quoting 40 characters
@example(body={"model": "digits", "inputs": [[0] * 64], "k" * 100_000: 1})  # 422, the key cut
@example(body={"model": "digits", "inputs": {f"k{i}": 1 for i in range(5000)}})  # 5000 errors: 10 shown
@example(body={"model": "digits", "inputs": {"x" * 5000: [[0] * 64]}})  # 400 for an unknown input
@WIRE
def test_predict_arbitrary_json_gets_the_validators_answer(service, body):
    # json.dumps writes NaN/Infinity and escapes surrogates: what Python clients really send.
    content = json.dumps(body)
    r = httpx.post(service.url + "/predict", content=content,
                   headers={"content-type": "application/json"}, timeout=30)
    expected = _expected_predict(body)
    event(f"expected {expected}")
    assert r.status_code == expected, (content[:300], r.status_code, r.text[:300],
                                       service.output()[-3000:])
    if r.status_code == 200:
        examples = body["inputs"] if isinstance(body["inputs"], list) else body["inputs"]["pixels"]
        outputs = r.json()["outputs"]
        assert len(outputs) == len(examples)
        assert all(set(o) == {"label", "probabilities"} and 0 <= o["label"] < 10 for o in outputs)
    else:
        problem = refusal_problem(r, "detail", client_strings(body))
        assert problem is None, problem


@pytest.mark.parametrize("path, key", [("/predict", "detail"), ("/v2/models/digits/infer", "error")])
def test_a_body_over_the_limit_is_413_and_says_the_limit(service, path, key):
    content = json.dumps({"model": "digits", "inputs": [[0] * 64], "padding": "p" * BODY_LIMIT})
    r = httpx.post(service.url + path, content=content, headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 413 and f"{BODY_LIMIT} bytes" in r.json()[key], r.text[:300]
    assert refusal_problem(r, key, ["p" * BODY_LIMIT]) is None


# ---------------------------------------------------------------------------------------------
# HTTP: /v2/models/digits/infer with mutated Open Inference Protocol requests
# ---------------------------------------------------------------------------------------------

MUTATIONS = [
    "none", "model", "version", "datatype", "shape", "value", "name", "no_data", "duplicate",
    "extra_input", "no_inputs", "output", "long_id", "extra_field", "batch", "binary_size", "header_length",
]
MODEL_NAMES = st.text(alphabet=st.characters(exclude_characters="/\\.?#%", exclude_categories=("Cs",)),
                      min_size=1, max_size=300).filter(lambda s: s != "digits")


@st.composite
def v2_cases(draw, mutation: str):
    """(path, body, headers, expected status, request, strings sent): a valid infer request, mutated."""
    n = draw(st.integers(1, 3))
    rows = [draw(DIGIT_VALUES) for _ in range(n)]
    values: list = [v for row in rows for v in row]
    item: dict = {"name": "pixels", "shape": [n, 64], "datatype": "FP32"}
    request: dict = {"inputs": [item]}
    binary = draw(st.booleans())
    if draw(st.booleans()):
        request["id"] = draw(st.text(max_size=20))
    outputs = draw(st.sampled_from([None, ["label"], ["probabilities", "label"]]))
    if outputs:
        request["outputs"] = [{"name": name} for name in outputs]
    if draw(st.booleans()):
        request["parameters"] = {"binary_data_output": True}
    path, expected, sent = "/v2/models/digits/infer", 200, []
    header_shift = 0
    if mutation == "model":
        name = draw(MODEL_NAMES)
        path, expected, sent = f"/v2/models/{urllib.parse.quote(name, safe='')}/infer", 404, [name]
    elif mutation == "version":
        version = draw(st.sampled_from(["1", "2", "0", "-1", "abc", "\u00b2", "9" * 30, "1.0", "9" * 5000]))
        path = f"/v2/models/digits/versions/{urllib.parse.quote(version)}/infer"
        expected, sent = (200 if version == "1" else 404), [version]
    elif mutation == "datatype":
        item["datatype"] = draw(
            st.sampled_from(["FP64", "INT64", "FP16", "BOOL", "fp32", "FLOAT32"]) | LONG_TEXT)
        expected, sent = 400, [item["datatype"]]
    elif mutation == "shape":
        item["shape"] = draw(st.sampled_from([[n * 64], [n, 8, 8], [n, 63], [n, 65], [64, n], [-1, 64],
                                              [n, 64, 1], [2**62, 2**62, 0], [0] * 70, [10**30, 64]]))
        expected = 200 if item["shape"] == [n, 64] else 400  # [64, n] is [n, 64] only when n = 64
    elif mutation == "value":
        anything = WIRE_LEAVES if not binary else st.floats(width=32)
        leaf = draw(anything | st.integers(0, 16) | st.floats(0, 16))
        values[draw(st.integers(0, len(values) - 1))] = leaf
        expected, sent = (200 if valid_pixel(leaf) else 400), client_strings(leaf)
    elif mutation == "name":
        item["name"] = draw(WIRE_TEXT | LONG_TEXT)
        expected, sent = (200 if item["name"] == "pixels" else 400), [item["name"]]
    elif mutation == "no_data":
        binary, expected = False, 400
        values = None
    elif mutation == "duplicate":
        request["inputs"].append(dict(item))
        binary, expected = False, 400
    elif mutation == "extra_input":
        other = draw(WIRE_TEXT | LONG_TEXT)
        assume(other != "pixels")
        request["inputs"].append({"name": other, "shape": [1], "datatype": "FP32", "data": [0]})
        binary, expected, sent = False, 400, [other]
    elif mutation == "no_inputs":
        request["inputs"], expected = [], 400
    elif mutation == "output":
        name = draw(st.sampled_from(["label", "probabilities"]) | WIRE_TEXT | LONG_TEXT)
        request["outputs"] = [{"name": name}]
        expected, sent = (200 if name in ("label", "probabilities") else 400), [name]
    elif mutation == "long_id":
        request["id"], expected = "i" * draw(st.integers(257, 2000)), 400
    elif mutation == "extra_field":
        key = draw(WIRE_TEXT | LONG_TEXT)
        assume(key not in request and key not in ("id", "parameters", "inputs", "outputs"))
        request[key], expected, sent = 1, 400, [key]
    elif mutation == "batch":
        n = draw(st.sampled_from([0, MAX_EXAMPLES + 1]))
        values, item["shape"], expected = [0] * (n * 64), [n, 64], 400
    elif mutation == "binary_size":
        binary, expected = True, 400
        header_shift = draw(st.sampled_from([-4, -1, 1, 4]))  # binary_data_size off from the bytes sent
    elif mutation == "header_length":
        binary, expected = True, 400
    if binary and values is not None:
        payload = np.asarray(values, dtype="<f4").tobytes()
        for entry in request["inputs"]:
            entry.pop("data", None)
        item["parameters"] = {"binary_data_size": len(payload) + header_shift}
        header = json.dumps(request).encode()
        length = str(len(header))
        if mutation == "header_length":
            length = draw(st.sampled_from([str(len(header) - 1), str(len(header) + 1), "-1", "12x", "",
                                           str(len(header) + len(payload) + 1), "9" * 40]))
        return path, header + payload, {"Inference-Header-Content-Length": length}, expected, request, sent
    if values is not None:
        item["data"] = values
    return path, json.dumps(request).encode(), {"content-type": "application/json"}, expected, request, sent


def _binary_outputs(r: httpx.Response) -> dict[str, np.ndarray]:
    length = int(r.headers["inference-header-content-length"])
    header, offset, found = json.loads(r.content[:length]), length, {}
    for output in header["outputs"]:
        dtype = DATATYPES[output["datatype"]].newbyteorder("<")
        size = output["parameters"]["binary_data_size"]
        found[output["name"]] = np.frombuffer(r.content[offset:offset + size], dtype).reshape(output["shape"])
        offset += size
    assert offset == len(r.content)
    return found


@pytest.mark.parametrize("mutation", MUTATIONS)
@given(data=st.data())
@settings(WIRE, max_examples=15)
def test_v2_infer_with_mutated_requests_gets_the_status_the_mutation_predicts(service, mutation, data):
    path, content, headers, expected, request, sent = data.draw(v2_cases(mutation))
    r = httpx.post(service.url + path, content=content, headers=headers, timeout=30)
    event(f"{r.status_code}")  # --hypothesis-show-statistics: what the run covered
    assert r.status_code == expected, (mutation, content[:300], r.status_code, r.text[:300])
    if r.status_code != 200:
        problem = refusal_problem(r, "error", sent + client_strings(request))
        assert problem is None, (mutation, problem)
        return
    n = request["inputs"][0]["shape"][0]
    wanted = [o["name"] for o in request.get("outputs") or []] or ["label", "probabilities"]
    if request.get("parameters", {}).get("binary_data_output"):
        outputs = _binary_outputs(r)
        answer = json.loads(r.content[:int(r.headers["inference-header-content-length"])])
    else:
        answer = r.json()
        outputs = {o["name"]: np.reshape(o["data"], o["shape"]) for o in answer["outputs"]}
    assert sorted(outputs) == sorted(wanted) and answer["model_name"] == "digits"
    assert answer.get("id") == request.get("id")
    if "label" in outputs:
        assert outputs["label"].shape == (n,) and ((0 <= outputs["label"]) & (outputs["label"] < 10)).all()
    if "probabilities" in outputs:
        assert outputs["probabilities"].shape == (n, 10)
        np.testing.assert_allclose(outputs["probabilities"].sum(axis=1), 1, atol=1e-5)


@given(body=WIRE_VALUES | st.binary(max_size=64), length=st.none() | st.integers(-2, 80).map(str))
@example(body=b'{"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [' + b"1" * 5000
         + b"]}]}", length=None)  # an integer too large for any parser to hold
@WIRE
def test_v2_infer_with_any_body_is_a_400_never_a_5xx(service, body, length):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Inference-Header-Content-Length": length} if length is not None else {}
    r = httpx.post(service.url + "/v2/models/digits/infer", content=content, headers=headers,
                   timeout=30)
    assert r.status_code == 400, (content[:300], r.status_code, r.text[:300])
    problem = refusal_problem(r, "error", client_strings(body))
    assert problem is None, problem
