"""PaddleX's own OCR pipeline file, served with no code, against PaddleX itself.

The pipeline file is PaddleX's (tests/support/ocr_pipeline.yaml, PaddleX 3.7.2's OCR.yaml for
PP-OCRv5_mobile det and rec) placed in a repository as ``ocr/pipeline.yaml`` beside the two exports,
unchanged. The reference is PaddleX's pipeline on the same file and pages, run in a venv of its own
(tests/support/paddlex_reference.py, made once and cached). On 24 generated pages (fonts, sizes,
colours, rotation, noise, JPEG: loadtest/pages.py) the service answers PaddleX's texts in
PaddleX's order, polygons within 2 px and scores within 0.01, over v2 (HTTP and gRPC) and over PaddleX
serving's own API, ``POST /ocr``, whose answers PaddleX's own response schema reads.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from loadtest import pages
from support import ocr_models, paddlex_reference
from support.servers import ServiceProcess, free_port

differences = paddlex_reference.differences


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """PaddleX's pipeline file as it is, its model_dirs relative to it, with the two exports beside."""
    root = tmp_path_factory.mktemp("repository")
    directory = root / "ocr"
    directory.mkdir()
    for kind in ("det", "rec"):
        shutil.copytree(ocr_models.models()[kind], directory / ocr_models.NAMES[kind])
    shutil.copyfile(paddlex_reference.PIPELINE, directory / "pipeline.yaml")
    return root


@pytest.fixture(scope="module")
def page_set():
    return pages.pages(24)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, page_set):
    """PaddleX's own pipeline on the same file (model_dirs made absolute for it) and pages."""
    yaml = paddlex_reference.pipeline_file(tmp_path_factory.mktemp("reference"))
    return paddlex_reference.reference_ocr(yaml, [p.data for p in page_set])


@pytest.fixture(scope="module")
def served(repository, pdf):
    """The service, its PDF limits those of ``pdf``, the largest the tests send to be read: 4 pages, its bytes."""
    grpc_port = free_port()
    proc = ServiceProcess(devices="cpu", models="ocr", model_repository=repository, grpc_port=grpc_port,
                          max_pdf_pages=4, max_pdf_bytes=len(pdf) + 10)
    try:
        yield proc.wait_ready(), f"127.0.0.1:{grpc_port}"
    finally:
        proc.stop()


def over_v2(url: str, data: bytes) -> dict:
    client = th.InferenceServerClient(url, network_timeout=120)  # one a call: it is not thread-safe
    image = th.InferInput("image", [1], "BYTES")
    image.set_data_from_numpy(np.array([data], dtype=object), binary_data=True)
    result = client.infer("ocr", [image])
    answer = {key: result.as_numpy(key) for key in paddlex_reference.FIELDS}
    answer["rec_texts"] = [text.decode() for text in answer["rec_texts"]]
    return answer


@pytest.mark.timeout(900)  # PaddleX's own run on the 24 pages is this test's set-up: a minute, more when busy
def test_the_pipeline_file_answers_as_paddlex_on_every_page(served, page_set, reference):
    proc, _ = served
    url = proc.url[len("http://"):]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # requests overlap: det and rec of several pages
        answers = list(pool.map(lambda p: over_v2(url, p.data), page_set))
    problems = {i: d for i, (a, r) in enumerate(zip(answers, reference)) if (d := differences(a, r))}
    assert problems == {}, problems
    assert sum(len(r["rec_texts"]) for r in reference) >= 5 * len(page_set)  # pages full of text, read
    # The comparison can fail: each page's answer against the next page's reference differs.
    assert all(differences(a, r) for a, r in zip(answers, reference[1:] + reference[:1]))


def test_paddlex_servings_api_answers_in_its_schema_with_paddlexs_results(served, page_set, reference):
    from paddlex.inference.serving.infra.models import AIStudioResultResponse
    from paddlex.inference.serving.schemas.ocr import InferResult

    proc, _ = served
    for index in (0, 1, 4):
        body = {"file": base64.b64encode(page_set[index].data).decode(), "fileType": 1, "visualize": False,
                "logId": f"page-{index}"}
        answer = httpx.post(f"{proc.url}/ocr", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        parsed = AIStudioResultResponse[InferResult].model_validate(answer.json())  # PaddleX's own schema
        assert parsed.logId == f"page-{index}" and parsed.errorCode == 0 and parsed.errorMsg == "Success"
        pruned = parsed.result.ocrResults[0].prunedResult
        assert differences(pruned, reference[index]) == []
        assert pruned["text_det_params"]["limit_type"] == "min" and pruned["text_type"] == "general"
        width, height = page_set[index].size
        assert parsed.result.dataInfo.model_dump() == {"width": width, "height": height, "type": "image"}


@pytest.fixture(scope="module")
def pdf(page_set):
    return paddlex_reference.pdf_of([page_set[i].data for i in (0, 3, 6, 7)])


@pytest.mark.timeout(900)  # PaddleX's own run on the PDF is this test's set-up
def test_a_pdf_is_read_as_paddlex_serving_reads_it_its_pages_answered_in_order(served, pdf, tmp_path):
    """fileType 0: PaddleX serving's own reader renders the pages, each a request of the pipeline, all at once;
    the answer's pages in order, each PaddleX's, and dataInfo PaddleX's PDF info."""
    proc, _ = served
    expected = paddlex_reference.reference_pdf(paddlex_reference.pipeline_file(tmp_path), pdf)
    answer = httpx.post(f"{proc.url}/ocr", json={"file": base64.b64encode(pdf).decode(), "fileType": 0}, timeout=300)
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert result["dataInfo"] == expected["info"] and result["dataInfo"]["numPages"] == 4
    pruned = [page["prunedResult"] for page in result["ocrResults"]]
    assert [differences(p, r) for p, r in zip(pruned, expected["results"])] == [[]] * 4
    assert len({tuple(p["rec_texts"]) for p in pruned}) == 4  # four pages, each its own text, in order


def test_a_pdf_over_the_limits_is_refused_before_a_page_is_rendered(served, pdf):
    """The limits are the 4-page ``pdf``'s, which the test above reads (the control: a PDF within both is read)."""
    proc, _ = served
    blank = cv2.imencode(".png", np.full((32, 32, 3), 255, np.uint8))[1].tobytes()
    five = paddlex_reference.pdf_of([blank] * 5)  # more pages, fewer bytes
    assert len(five) < len(pdf)
    answer = httpx.post(f"{proc.url}/ocr", json={"file": base64.b64encode(five).decode(), "fileType": 0}, timeout=60)
    assert answer.status_code == 422 and "the PDF has 5 pages; send one of at most 4 pages" in \
        answer.json()["errorMsg"], answer.text
    big = paddlex_reference.pdf_of([pages.page(i).data for i in range(8)])
    answer = httpx.post(f"{proc.url}/ocr", json={"file": base64.b64encode(big).decode(), "fileType": 0}, timeout=60)
    assert answer.status_code == 422 and "(--max-pdf-bytes)" in answer.json()["errorMsg"], answer.text


def test_grpc_answers_as_http(served, page_set, reference):
    proc, target = served
    image = tg.InferInput("image", [1], "BYTES")
    image.set_data_from_numpy(np.array([page_set[2].data], dtype=object))
    result = tg.InferenceServerClient(target).infer("ocr", [image])
    answer = {key: result.as_numpy(key) for key in paddlex_reference.FIELDS}
    answer["rec_texts"] = [text.decode() for text in answer["rec_texts"]]
    assert differences(answer, reference[2]) == []


@pytest.mark.parametrize("body, says", [
    ({"fileType": 1}, '"loc": "body.file"'),
    ({"file": "http://127.0.0.1:9/page.png", "fileType": 1}, "URLs are not fetched"),
    ({"file": base64.b64encode(b"%PDF-1.4").decode(), "fileType": 0}, "not a PDF pypdfium2 can open"),
    ({"file": base64.b64encode(b"not an image").decode(), "fileType": 1}, "not an image OpenCV can decode"),
    ({"file": "***", "fileType": 1}, "file is not base64"),
    ({"file": base64.b64encode(b"x").decode()}, "File type cannot be determined"),
    ({"file": base64.b64encode(b"x").decode(), "fileType": 1, "textDetThresh": "high"}, '"loc": "body.textDetThresh"'),
    ({"file": base64.b64encode(b"x").decode(), "fileType": 1, "textDetLimitType": "wide"}, "textDetLimitType"),
    ({"file": base64.b64encode(b"x").decode(), "fileType": 1, "textDetLimitSideLen": -1}, "textDetLimitSideLen"),
])
def test_a_bad_request_is_a_422_in_paddlexs_error_shape_naming_what_to_send(served, body, says):
    proc, _ = served
    answer = httpx.post(f"{proc.url}/ocr", json=body, timeout=30)
    assert answer.status_code == 422, answer.text
    found = answer.json()
    assert set(found) == {"logId", "errorCode", "errorMsg"} and found["errorCode"] == 422
    assert says in found["errorMsg"] and len(found["errorMsg"]) < 400


def test_a_module_asked_of_a_pipeline_without_it_is_refused_in_paddlexs_words(served, page_set):
    """PaddleX's pipeline object fails on a module switched on that its file has no model for: the request's 400
    (/ocr's 422) naming the switch, where PaddleX serving answers 500."""
    from tritonclient.utils import InferenceServerException

    proc, _ = served
    image = th.InferInput("image", [1], "BYTES")
    image.set_data_from_numpy(np.array([page_set[0].data], dtype=object), binary_data=True)
    client = th.InferenceServerClient(proc.url[len("http://"):], network_timeout=120)
    for parameters in ({"use_textline_orientation": True}, {"use_doc_orientation_classify": True}):
        with pytest.raises(InferenceServerException) as refused:
            client.infer("ocr", [image], parameters=parameters)
        assert refused.value.status() == "400", refused.value.message()
        assert f"with {next(iter(parameters))} true" in refused.value.message(), refused.value.message()
    body = {"file": base64.b64encode(page_set[0].data).decode(), "fileType": 1, "useDocUnwarping": True}
    answer = httpx.post(f"{proc.url}/ocr", json=body, timeout=60)
    assert answer.status_code == 422 and "with use_doc_unwarping true" in answer.json()["errorMsg"], answer.text
    # Off is what this pipeline does anyway: answered.
    off = client.infer("ocr", [image], parameters={"use_textline_orientation": False})
    assert set(off.as_numpy("textline_orientation_angles").tolist()) == {-1}


#: Settings other than the pipeline file's, as PaddleX's pipeline file writes them, and as POST /ocr's
#: per-request fields (PaddleX serving's names) ask for them.
CHANGED = {"limit_side_len: 64": "limit_side_len: 960", "limit_type: min": "limit_type: max",
           "box_thresh: 0.6": "box_thresh: 0.7", "unclip_ratio: 1.5": "unclip_ratio: 2.0",
           "score_thresh: 0.0": "score_thresh: 0.9"}
ASKED = {"textDetLimitSideLen": 960, "textDetLimitType": "max", "textDetBoxThresh": 0.7, "textDetUnclipRatio": 2.0,
         "textRecScoreThresh": 0.9}
CHANGED_PAGES = (0, 3, 5)


@pytest.fixture(scope="module")
def changed_reference(tmp_path_factory, page_set):
    """PaddleX's own pipeline on a copy of the file with CHANGED's settings, on CHANGED_PAGES."""
    directory = tmp_path_factory.mktemp("changed")
    text = paddlex_reference.PIPELINE.read_text()
    for old, new in CHANGED.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    template = directory / "template" / paddlex_reference.PIPELINE.name
    template.parent.mkdir()
    template.write_text(text)
    yaml = paddlex_reference.pipeline_file(directory, template=template)
    return paddlex_reference.reference_ocr(yaml, [page_set[i].data for i in CHANGED_PAGES])


def test_per_request_settings_answer_as_paddlex_with_them_in_its_file(served, page_set, reference, changed_reference):
    proc, target = served
    for index, expected in zip(CHANGED_PAGES, changed_reference):
        body = {"file": base64.b64encode(page_set[index].data).decode(), "fileType": 1, **ASKED}
        answer = httpx.post(f"{proc.url}/ocr", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        pruned = answer.json()["result"]["ocrResults"][0]["prunedResult"]
        assert differences(pruned, expected) == []
        assert pruned["text_det_params"] == {"limit_side_len": 960, "limit_type": "max", "thresh": 0.3,
                                             "max_side_limit": 4000, "box_thresh": 0.7, "unclip_ratio": 2.0}
        assert pruned["text_rec_score_thresh"] == 0.9
    # The same over gRPC, with PaddleX's pipeline.predict names as the request's parameters.
    image = tg.InferInput("image", [1], "BYTES")
    image.set_data_from_numpy(np.array([page_set[CHANGED_PAGES[0]].data], dtype=object))
    names = {"text_det_limit_side_len": 960, "text_det_limit_type": "max", "text_det_box_thresh": 0.7,
             "text_det_unclip_ratio": 2.0, "text_rec_score_thresh": 0.9}
    result = tg.InferenceServerClient(target).infer("ocr", [image], parameters=names)
    answer = {key: result.as_numpy(key) for key in paddlex_reference.FIELDS}
    answer["rec_texts"] = [text.decode() for text in answer["rec_texts"]]
    assert differences(answer, changed_reference[0]) == []
    # The comparison can fail: the settings change PaddleX's answer on these pages.
    assert all(differences(c, reference[i]) for i, c in zip(CHANGED_PAGES, changed_reference))


def test_a_zero_setting_is_the_files_as_paddlex_takes_it(served, page_set, reference):
    proc, _ = served
    body = {"file": base64.b64encode(page_set[1].data).decode(), "fileType": 1, "textDetThresh": 0.0,
            "textDetBoxThresh": 0, "textDetLimitSideLen": 0}
    answer = httpx.post(f"{proc.url}/ocr", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    pruned = answer.json()["result"]["ocrResults"][0]["prunedResult"]
    assert differences(pruned, reference[1]) == []  # run with the file's 0.3, 0.6 and 64
    # Shown as sent, as PaddleX's text_det_params shows them.
    assert (pruned["text_det_params"]["thresh"], pruned["text_det_params"]["box_thresh"],
            pruned["text_det_params"]["limit_side_len"]) == (0.0, 0.0, 0)


def test_a_bad_setting_over_v2_is_a_400_naming_it(served, page_set):
    proc, _ = served
    image = {"name": "image", "shape": [1], "datatype": "BYTES", "data": ["x"]}
    for parameters, says in (({"text_det_thresh": "high"}, "text_det_thresh"),
                             ({"text_rec_score_thresh": "high"}, "text_rec_score_thresh"),
                             ({"text_det_limit_type": "wide"}, "text_det_limit_type"),
                             ({"no_such_setting": 1}, "not a setting of this PaddleX pipeline"),
                             ({"text_det_max_side_limit": 0}, "text_det_max_side_limit")):
        answer = httpx.post(f"{proc.url}/v2/models/ocr/infer", json={"inputs": [image], "parameters": parameters},
                            timeout=60)
        assert answer.status_code == 400 and says in answer.json()["error"], answer.text


def test_each_model_of_the_pipeline_says_what_runs_it(served):
    """The exports run on the backend auto measured fastest of those that agree with Paddle Inference (the
    file's run_mode tunes the Predictor and names no runtime); the pipeline's one step is PaddleX's pipeline
    object, Python of its own."""
    proc, _ = served
    platforms = {m: httpx.get(f"{proc.url}/v2/models/{m}").json()["platform"]
                 for m in ("ocr", "ocr.pipeline", "ocr.TextDetection", "ocr.TextRecognition")}
    assert {m: platforms.pop(m) for m in ("ocr", "ocr.pipeline")} == {"ocr": "ensemble", "ocr.pipeline": "paddle_python"}
    names = {"inference": "paddle_inference", "onnxruntime": "onnxruntime_onnx", "openvino": "openvino"}
    for model, platform in platforms.items():
        parameters = httpx.get(f"{proc.url}/v2/models/{model}/config").json()["parameters"]
        choice = json.loads(parameters["backend_choice"]["string_value"])["cpu"]
        assert set(choice["timings_ms"]) == set(names) and not choice["passed_over"], choice
        assert platform == names[choice["serves"]] and parameters["backend"]["string_value"] == "auto"


def test_word_boxes_are_paddlexs(served, page_set):
    """returnWordBox is PaddleX's own: its result's words and their boxes, which the answer carries."""
    proc, _ = served
    body = {"file": base64.b64encode(page_set[0].data).decode(), "fileType": 1, "returnWordBox": True}
    answer = httpx.post(f"{proc.url}/ocr", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    pruned = answer.json()["result"]["ocrResults"][0]["prunedResult"]
    assert pruned["return_word_box"] is True and pruned["text_word"] and len(pruned["text_word_boxes"]) == len(
        pruned["rec_texts"])


#: Locust's own start of the load test, up to its ``init`` event (after which Locust arms ``-t``): what the
#: locustfile then holds, as JSON.
LOCUST_INIT = """
import json, sys
import loadtest.locustfile as locustfile  # (imports locust, and with it gevent's patches: a process of its own)
from locust import events
from locust.argument_parser import parse_options
from locust.env import Environment

options = parse_options(["-f", "loadtest/", "--host", sys.argv[1], "--headless", "-t", "1s"])
environment = Environment(user_classes=[locustfile.Client], events=events, host=sys.argv[1], parsed_options=options)
events.init.fire(environment=environment, runner=None, web_ui=None)
print(json.dumps({"pages": len(locustfile.OCR_PAGES), "pdfs": len(locustfile.OCR_PDFS),
                  "tasks": sorted(task.__name__ for task in locustfile.Client.tasks)}))
"""


def test_the_load_test_draws_its_pages_before_locust_arms_its_run_time(served):
    """The load test reads what the service serves and draws the pages of its PaddleX pipelines at Locust's
    ``init``, before ``-t`` runs: drawn when the test started, they took all of a 10 s run on a slow machine,
    and no request was sent (docs/benchmarks.md). At ``init`` here: the PaddleX OCR pipeline's pages and
    PDFs, and its tasks alone."""
    proc, _ = served
    root = Path(__file__).resolve().parents[2]
    ran = subprocess.run([sys.executable, "-c", LOCUST_INIT, proc.url], cwd=root, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout.splitlines()[-1]) == {"pages": 8, "pdfs": 4,
                                                       "tasks": ["paddlex_ocr", "paddlex_ocr_pdf"]}, ran.stdout
