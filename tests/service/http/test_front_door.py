"""What a new user meets first, against a real service: the documentation with no internet, an
index at /, and errors that say what to send instead."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from types import SimpleNamespace
from urllib.parse import urljoin, urlparse

import httpx
import pytest

DIGIT = [0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0, 0, 3, 15, 2, 0, 11, 8, 0, 0, 4, 12, 0,
         0, 8, 8, 0, 0, 5, 8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0, 0, 2, 14, 5, 10, 12, 0, 0, 0, 0,
         6, 13, 10, 0, 0, 0]
LIMIT = 32  # max_examples_per_request below, under the 64 numbers of one digit


@pytest.fixture(scope="module")
def service_settings():
    return {"DEVICES": "sim:0,sim:1", "WORKERS_PER_DEVICE": 1, "MAX_EXAMPLES_PER_REQUEST": LIMIT}


def post(service, path: str, **kwargs) -> httpx.Response:
    return httpx.post(f"{service.url}{path}", timeout=30, **kwargs)


# --------------------------------------------------------------------------------------------- /docs


class Loads(HTMLParser):
    """Every URL a page makes the browser load: scripts, stylesheets, icons, images."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "img", "iframe") and attrs.get("src"):
            self.urls.append(attrs["src"])
        if tag == "link" and attrs.get("href"):
            self.urls.append(attrs["href"])


TYPES = {".js": ("text/javascript", "application/javascript"), ".css": ("text/css",), ".png": ("image/png",)}


def loaded_by(service, page: str) -> dict[str, httpx.Response]:
    """Each file ``page`` loads, fetched from the service: none from another host."""
    answer = httpx.get(f"{service.url}{page}")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html")
    here = urlparse(service.url).netloc
    # Nothing on the page names another host (FastAPI's own pages load their files from a CDN).
    elsewhere = [u for u in re.findall(r"(?:https?:)?//[\w.-]+[^\s\"'<>)]*", answer.text)
                 if urlparse(u if ":" in u else "http:" + u).netloc != here]
    assert not elsewhere, elsewhere
    parser = Loads()
    parser.feed(answer.text)
    files = {}
    for url in parser.urls:
        absolute = urljoin(f"{service.url}{page}", url)
        assert urlparse(absolute).netloc == here, f"{page} loads {url} from another host"
        files[url] = httpx.get(absolute)
    return files


def check_types(files: dict[str, httpx.Response]) -> None:
    for url, answer in files.items():
        assert answer.status_code == 200, url
        kind = answer.headers["content-type"].split(";")[0]
        assert kind in TYPES[url[url.rindex("."):]], (url, kind)
        assert len(answer.content) > 500, url


def test_docs_load_swagger_ui_from_the_service(service):
    files = loaded_by(service, "/docs")
    assert sorted(url.rsplit("/", 1)[1] for url in files) == ["favicon.png", "swagger-ui-bundle.js",
                                                              "swagger-ui.css"]
    check_types(files)
    # The Swagger UI served reads the schema's version: 4.x ("openapi: 3.0.n" only) shows an error
    # page for FastAPI's 3.1.0 instead of the endpoints.
    schema = httpx.get(f"{service.url}/openapi.json").json()
    assert schema["openapi"].startswith("3.1") and "/predict" in schema["paths"]
    bundle = next(a for url, a in files.items() if url.endswith(".js")).text
    assert "isOAS31" in bundle
    assert httpx.get(f"{service.url}/docs/oauth2-redirect").status_code == 200


def test_redoc_loads_from_the_service_too(service):
    files = loaded_by(service, "/redoc")
    assert sorted(url.rsplit("/", 1)[1] for url in files) == ["favicon.png", "redoc.standalone.js"]
    check_types(files)


def test_the_docs_assets_take_only_get(service):
    answer = post(service, "/docs/assets/swagger-ui.css")
    assert answer.status_code == 405 and set(answer.headers["allow"].split(", ")) == {"GET", "HEAD"}
    assert answer.json()["detail"].startswith("POST /docs/assets/swagger-ui.css is not allowed: use GET")


# --------------------------------------------------------------------------------------------- GET /


def test_the_root_lists_the_endpoints(service):
    answer = httpx.get(f"{service.url}/")
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    index = answer.json()
    assert index["service"] == "placeenv inference service" and index["version"]
    assert (index["docs"], index["openapi"]) == ("/docs", "/openapi.json")
    listed = {(e["method"], e["path"]) for e in index["endpoints"]}
    assert {("GET", "/docs"), ("GET", "/redoc"), ("GET", "/openapi.json"), ("POST", "/predict"),
            ("GET", "/v1/models"), ("GET", "/v2"), ("GET", "/v2/models/{name}"),
            ("POST", "/v2/models/{name}/infer"), ("GET", "/metrics"), ("GET", "/healthz"),
            ("GET", "/readyz")} <= listed
    for method, path in listed:  # each one is a route that takes that method
        real = path.replace("{name}", "digits").replace("{version}", "1")
        status = httpx.request(method, f"{service.url}{real}", json={}).status_code
        assert status not in (404, 405), (method, path, status)


# ----------------------------------------------------------------------- one example without its list


def test_one_example_without_its_list_says_to_wrap_it(service):
    answer = post(service, "/predict", json={"model": "digits", "inputs": DIGIT})
    assert answer.status_code == 400 and answer.headers["content-type"] == "application/json"
    assert answer.json() == {"detail": '"inputs" looks like one example (64 numbers), not a list of examples: '
                                       'wrap it in a list, e.g. {"model": "digits", "inputs": [[...64 numbers...]]}'}
    # Before, the 64 numbers were taken for 64 examples.
    assert "examples in one request" not in answer.text


def test_one_example_by_input_name_names_the_input(service):
    answer = post(service, "/predict", json={"model": "digits", "inputs": {"pixels": DIGIT}})
    assert answer.status_code == 400
    assert answer.json()["detail"] == (
        'input "pixels" looks like one example (64 numbers), not a list of examples: wrap it in a list, '
        'e.g. {"model": "digits", "inputs": {"pixels": [[...64 numbers...]]}}')


def test_numbers_too_few_for_an_example_name_the_example_shape(service):
    answer = post(service, "/predict", json={"model": "digits", "inputs": list(range(40))})
    assert answer.status_code == 400
    assert answer.json()["detail"] == (
        '"inputs" holds 40 numbers, not a list of examples: model \'digits\' takes a list of examples of '
        'shape [64] each, e.g. {"model": "digits", "inputs": [[...64 numbers...]]}')


def test_many_real_examples_still_get_the_batch_limit(service):
    for count in (LIMIT + 1, 64):  # 64 examples: as many as one example has numbers
        answer = post(service, "/predict", json={"model": "digits", "inputs": [DIGIT] * count})
        assert answer.status_code == 400
        assert answer.json() == {"detail": f"{count} examples in one request; the limit is {LIMIT}"}
    assert post(service, "/predict", json={"model": "digits", "inputs": [DIGIT]}).status_code == 200


def test_an_example_of_several_dimensions_is_recognised():
    # mobilenet's images, [3, 32, 32] each: one sent without its list (in process: no model to build).
    from placeenv.serve.http.predict import not_a_list_of_examples

    entry = SimpleNamespace(name="mobilenet", max_batch_size=8)
    spec = SimpleNamespace(name="image", shape=(-1, 3, 32, 32))
    image = [[[0.5] * 32] * 32] * 3
    one = not_a_list_of_examples(entry, spec, image, named=False)
    assert str(one) == ('"inputs" looks like one example (numbers of shape [3, 32, 32]), not a list of examples: '
                        'wrap it in a list, e.g. {"model": "mobilenet", "inputs": [[...numbers of shape '
                        '[3, 32, 32]...]]}')
    assert "holds numbers of shape [32, 32]" in str(not_a_list_of_examples(entry, spec, image[0], named=False))
    assert not_a_list_of_examples(entry, spec, [image], named=False) is None
    assert not_a_list_of_examples(entry, spec, ["not numbers"], named=False) is None  # from_json's to word


# ------------------------------------------------------------------------------------- Content-Type


BODY = b'{"model": "digits", "inputs": [[' + b"0," * 63 + b"0]]}"


@pytest.mark.parametrize("content_type, got", [
    (None, "no Content-Type"),
    ("text/plain", "Content-Type: 'text/plain'"),
    ("application/x-www-form-urlencoded", "Content-Type: 'application/x-www-form-urlencoded'"),
])
def test_a_predict_body_not_sent_as_json_names_the_header(service, content_type, got):
    headers = {} if content_type is None else {"content-type": content_type}
    answer = post(service, "/predict", content=BODY, headers=headers)
    assert answer.status_code == 415 and answer.headers["content-type"] == "application/json"
    assert answer.json() == {
        "detail": f"/predict reads a JSON body: send the header Content-Type: application/json; got {got}"}
    # Before, a 422 about the raw bytes ("model_attributes_type") that echoed them.
    assert "model_attributes_type" not in answer.text and "inputs" not in answer.text
    assert post(service, "/predict", content=BODY, headers={"content-type": "application/json"}).status_code == 200


def test_a_long_content_type_is_quoted_only_as_a_prefix(service):
    answer = post(service, "/predict", content=BODY, headers={"content-type": "text/" + "x" * 5000})
    assert answer.status_code == 415 and len(answer.text) < 300 and "(5007 characters)" in answer.text  # its repr, quotes included


V2_BODY = (b'{"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": ['
           + b"0," * 63 + b"0]}]}")


def test_an_infer_body_of_another_type_names_the_types_it_takes(service):
    answer = post(service, "/v2/models/digits/infer", content=V2_BODY, headers={"content-type": "text/plain"})
    assert answer.status_code == 415 and answer.headers["content-type"] == "application/json"
    assert answer.json() == {"error": (
        "an infer body is JSON, or Triton's binary tensor format: send the header Content-Type: application/json, "
        "or Content-Type: application/octet-stream with Inference-Header-Content-Length: <bytes of the JSON "
        "header> before the binary tensor data; got Content-Type: 'text/plain'")}


@pytest.mark.parametrize("headers", [{"content-type": "application/json"},
                                     {"content-type": "application/octet-stream"}, {}])
def test_an_infer_body_as_json_binary_or_untyped_is_read(service, headers):
    # tritonclient sends no Content-Type; its binary requests are application/octet-stream elsewhere.
    assert post(service, "/v2/models/digits/infer", content=V2_BODY, headers=headers).status_code == 200


def test_tritonclient_is_still_served(service):
    import numpy as np
    import tritonclient.http as triton

    client = triton.InferenceServerClient(urlparse(service.url).netloc)
    for binary in (False, True):
        pixels = triton.InferInput("pixels", [2, 64], "FP32")
        pixels.set_data_from_numpy(np.zeros((2, 64), np.float32), binary_data=binary)
        assert client.infer("digits", [pixels]).as_numpy("label").shape == (2,)


def test_the_415s_are_counted(service):
    before = service.total("inference_requests_total", status="unsupported_media_type")
    post(service, "/predict", content=BODY, headers={"content-type": "text/plain"})
    post(service, "/v2/models/digits/infer", content=V2_BODY, headers={"content-type": "text/plain"})
    assert service.total("inference_requests_total", status="unsupported_media_type") == before + 2


# ------------------------------------------------------------------------------------------- 405


PREDICT_BODY = 'a JSON body {"model": "digits", "inputs": [[...64 numbers...], ...]}'


@pytest.mark.parametrize("method, path, key, allow, what", [
    ("GET", "/predict", "detail", "POST", f"(the simple JSON API: {PREDICT_BODY})"),
    ("PUT", "/predict", "detail", "POST", f"(the simple JSON API: {PREDICT_BODY})"),
    ("GET", "/v2/models/digits/infer", "error", "POST",
     '(inference: a JSON body {"inputs": [{"name", "shape", "datatype", "data"}, ...]}, or a JSON header then '
     "binary tensors (Triton's binary tensor extension))"),
    ("DELETE", "/healthz", "detail", "GET", "(liveness)"),
    ("POST", "/v1/models", "detail", "GET", "(the models, their inputs and outputs, and the devices)"),
    ("PUT", "/v2/models/digits/ready", "error", "GET", ""),
])
def test_a_wrong_method_says_which_to_use(service, method, path, key, allow, what):
    answer = httpx.request(method, f"{service.url}{path}")
    # The router lists the methods of a set: in any order.
    assert answer.status_code == 405 and set(answer.headers["allow"].split(", ")) == set(allow.split(", "))
    use = allow.split(",")[0]
    assert answer.json() == {key: f"{method} {path} is not allowed: use {use} {path}{' ' if what else ''}{what}"}


def test_a_long_path_is_quoted_only_as_a_prefix(service):
    path = f"/v2/models/{'m' * 3000}/infer"
    answer = httpx.get(f"{service.url}{path}")
    assert answer.status_code == 405 and len(answer.text) < 500
    assert answer.json()["error"].startswith(f"GET {path[:80]}... is not allowed: use POST")


def test_a_wrong_method_on_an_inference_path_is_counted(service):
    before = service.total("inference_requests_total", status="method_not_allowed")
    httpx.get(f"{service.url}/predict")
    httpx.delete(f"{service.url}/healthz")  # not an inference request
    assert service.total("inference_requests_total", status="method_not_allowed") == before + 1
