"""PaddleX's document preprocessor pipeline, served from its file by the one mechanism with no code of its
own (a row of ``paddlex_pipeline.FIELDS`` for its typed outputs), against PaddleX itself.

The file is PaddleX's doc_preprocessor.yaml with the page-orientation and unwarping stand-ins
(tests/support/doc_preprocessor_pipeline.yaml; tests/support/standin_models.py). The pages are the OCR
tests' bowed and turned a quarter, half or three quarters, or not at all. PaddleX's own pipeline on the
same file and pages is the reference: the same result (each page's angle and settings). The corrected page
is the upright one (its sides back as drawn); the control, orientation off per request, leaves it turned.
"""

from __future__ import annotations

import json
import shutil

import cv2
import numpy as np
import pytest
from loadtest import pages
from support import paddlex_reference, standin_models

PIPELINE = paddlex_reference.PIPELINE.with_name("doc_preprocessor_pipeline.yaml")
#: Pages the orientation stand-in reads surely (as test_paddlex_docpre.py's), and each one's turn.
PAGES = {0: 0, 2: 90, 4: 180, 5: 270, 9: 90, 11: 180, 12: 270, 17: 0}


@pytest.fixture(scope="module")
def images():
    return [standin_models.turned(pages.page(index).data, angle, bow=True) for index, angle in PAGES.items()]


def _place(directory):
    for name in (standin_models.ORIENTATION, standin_models.UNWARPING):
        standin_models.copy_to(name, directory / name)
    return directory


@pytest.fixture(scope="module")
def reference(tmp_path_factory, images):
    scratch = tmp_path_factory.mktemp("reference")
    models = _place(scratch / "models")
    yaml = paddlex_reference.pipeline_file(scratch, models, template=PIPELINE)
    return paddlex_reference.reference_ocr(yaml, images, fields=("model_settings", "angle"))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    _place(root / "pages")
    shutil.copyfile(PIPELINE, root / "pages" / "pipeline.yaml")
    with paddlex_reference.served(root, "pages") as proc:
        yield proc


def _over_v2(url: str, data: bytes, parameters: dict | None = None) -> tuple[dict, int, tuple]:
    result = paddlex_reference.over_v2(url, "pages", data, parameters)
    return (json.loads(result.as_numpy("result")[0]), int(result.as_numpy("angle")[0]),
            result.as_numpy("output_img").shape[1:3])


def _shape(data: bytes) -> tuple:
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR).shape[:2]


def _upright(data: bytes, angle: int) -> tuple:
    height, width = _shape(data)
    return (width, height) if angle in (90, 270) else (height, width)


@pytest.mark.timeout(900)  # PaddleX's own run is this test's set-up
def test_the_pages_are_corrected_as_paddlex_corrects_them(served, images, reference):
    url = served.url[len("http://"):]
    answers = paddlex_reference.together(served, _over_v2, images)  # pages in flight, their calls batched
    assert [r["angle"] for r in reference] == list(PAGES.values())  # the stand-in reads these pages right
    assert [{k: result[k] for k in ("model_settings", "angle")} for result, _, _ in answers] == reference
    assert [angle for _, angle, _ in answers] == list(PAGES.values())
    # The corrected page stands as drawn: a page turned a quarter comes back with its sides as they were.
    upright = [_upright(data, angle) for data, angle in zip(images, PAGES.values())]
    assert [shape for _, _, shape in answers] == upright
    # The control: orientation off for this request leaves the quarter-turned page on its side, unclassified.
    result, angle, shape = _over_v2(url, images[1], {"use_doc_orientation_classify": False})
    assert angle == -1 and result["model_settings"]["use_doc_orientation_classify"] is False
    assert shape == _shape(images[1]) != upright[1]


def test_its_models_are_the_repositorys(served):
    import httpx

    names = {m["name"] for m in httpx.post(f"{served.url}/v2/repository/index", json={}, timeout=30).json()}
    assert names == {"pages", "pages.pipeline", "pages.DocOrientationClassify", "pages.DocUnwarping"}
    outputs = httpx.get(f"{served.url}/v2/models/pages", timeout=30).json()["outputs"]
    assert [o["name"] for o in outputs] == ["result", "angle", "output_img"]


def test_paddlex_servings_own_request_gets_its_answer(served, images, reference):
    """``/document-preprocessing`` with PaddleX serving's request: its schema's result, the pruned result
    PaddleX's and the corrected page (``outputImage``, base64 JPEG as PaddleX serving encodes it) upright."""
    import base64

    import httpx

    body = {"file": base64.b64encode(images[1]).decode(), "fileType": 1}
    answer = httpx.post(f"{served.url}/document-preprocessing", json=body, timeout=120)
    assert answer.status_code == 200, answer.text[:500]
    (page,) = answer.json()["result"]["docPreprocessingResults"]
    assert {k: page["prunedResult"][k] for k in ("model_settings", "angle")} == reference[1]
    corrected = base64.b64decode(page["outputImage"])
    assert _shape(corrected) == _upright(images[1], list(PAGES.values())[1])
