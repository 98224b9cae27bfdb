"""PaddleX's OCR pipeline with the document preprocessor on, served from its file with no code, against
PaddleX itself.

The file is PaddleX's OCR.yaml with ``use_doc_preprocessor: True`` and its ``DocPreprocessor``
sub-pipeline, page orientation and unwarping both on (tests/support/ocr_docpre_pipeline.yaml). Its two
models are stand-ins with PP-LCNet_x1_0_doc_ori's and UVDoc's names, inputs, outputs and
``inference.yml`` (tests/support/standin_models.py: PaddleOCR's cannot be downloaded on this machine). The
pages are the OCR tests' (loadtest/pages.py), bowed as a photographed page is, then turned a quarter,
half or three quarters, or not at all. PaddleX's own pipeline on the same pages is the reference: the
same texts, angles, polygons within 2 px and scores within 0.01. The control: the same pages with the
preprocessor off per request read the turned pages' lines wrong, and the angle is -1.
"""

from __future__ import annotations

import base64
import shutil

import httpx
import numpy as np
import pytest
from loadtest import pages
from support import standin_models, paddlex_reference

differences = paddlex_reference.differences

FIELDS = (*paddlex_reference.FIELDS, "doc_preprocessor_res")
#: The test pages whose layout the orientation stand-in reads surely (a score of 0.97 or more at each turn),
#: and each one's turn: the angle PaddleX's rotate_image turns it back by.
PAGES = {0: 0, 2: 90, 4: 180, 5: 270, 9: 90, 11: 180, 12: 270, 17: 0}
OFF = {"use_doc_orientation_classify": False, "use_doc_unwarping": False}


@pytest.fixture(scope="module")
def page_set():
    return [(pages.page(index), angle) for index, angle in PAGES.items()]


@pytest.fixture(scope="module")
def images(page_set):
    return [standin_models.turned(page.data, angle, bow=True) for page, angle in page_set]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """The file as it is, its model_dirs relative to it, the four exports beside it."""
    root = tmp_path_factory.mktemp("repository")
    directory = root / "ocr"
    paddlex_reference.place_docpre_models(directory)
    shutil.copyfile(paddlex_reference.DOCPRE_PIPELINE, directory / "pipeline.yaml")
    return root


@pytest.fixture(scope="module")
def reference(tmp_path_factory, images):
    """PaddleX's own pipeline on the pages, from the same file and exports."""
    scratch = tmp_path_factory.mktemp("reference")
    models = paddlex_reference.place_docpre_models(scratch / "models")
    yaml = paddlex_reference.pipeline_file(scratch, models, template=paddlex_reference.DOCPRE_PIPELINE)
    return paddlex_reference.reference_ocr(yaml, images, fields=FIELDS)


@pytest.fixture(scope="module")
def served(repository):
    with paddlex_reference.served(repository, "ocr") as proc:
        yield proc


def over_v2(url: str, data: bytes, parameters: dict | None = None) -> dict:
    result = paddlex_reference.over_v2(url, "ocr", data, parameters)
    answer = {key: result.as_numpy(key) for key in (*paddlex_reference.FIELDS, "doc_preprocessor_angle")}
    answer["rec_texts"] = [text.decode() for text in answer["rec_texts"]]
    answer["angle"] = int(answer.pop("doc_preprocessor_angle")[0])
    return answer


def _read(answers, page_set, angles=standin_models.TURNS) -> float:
    """The share of the lines of the pages turned by ``angles`` whose text is among their page's texts."""
    lines = [(line, answer["rec_texts"]) for (page, angle), answer in zip(page_set, answers)
             if angle in angles for line in page.lines]
    return sum(line in texts for line, texts in lines) / len(lines)


@pytest.mark.timeout(1200)
def test_the_document_preprocessor_answers_as_paddlex(served, page_set, images, reference):
    # The stand-in classifies these pages right (a precondition of the reading checks below).
    assert [r["doc_preprocessor_res"]["angle"] for r in reference] == list(PAGES.values())
    url = served.url[len("http://"):]
    answers = paddlex_reference.together(served, over_v2, images)  # pages in flight: their steps overlap
    problems = {i: d for i, (a, r) in enumerate(zip(answers, reference)) if (d := differences(a, r))}
    assert problems == {}, problems
    assert [a["angle"] for a in answers] == list(PAGES.values())
    assert _read(answers, page_set) >= 0.8
    # The control: the preprocessor off for these requests reads the lines of the pages upside down or turned
    # anticlockwise wrong; no angle. (A page turned clockwise reads anyway: PaddleX turns a crop whose height
    # is 1.5 times its width or more a quarter anticlockwise.)
    off = [over_v2(url, data, OFF) if angle in (180, 270) else None for data, angle in zip(images, PAGES.values())]
    assert _read(off, page_set, (180, 270)) <= 0.2
    assert {a["angle"] for a in off if a is not None} == {-1}


def test_unwarping_flattens_the_bowed_lines(served, page_set, images, reference):
    """Orientation on, unwarping off per request: the upright page's lines are still bowed, so their boxes
    are taller than the flattened page's (each box holds a line's rise across the page)."""
    url = served.url[len("http://"):]
    index = list(PAGES).index(0)  # the upright, bowed first page
    # (PaddleX's: a request that sends one switch, false, turns the whole preprocessor off.)
    bowed = over_v2(url, images[index], {"use_doc_orientation_classify": True, "use_doc_unwarping": False})

    def height(polys):
        polys = np.asarray(polys)
        return float(np.median(polys[:, :, 1].max(axis=1) - polys[:, :, 1].min(axis=1)))

    assert bowed["angle"] == 0
    assert height(bowed["dt_polys"]) > 1.3 * height(reference[index]["dt_polys"])


def test_paddlex_servings_api_shows_the_preprocessor_per_request(served, images, reference):
    from paddlex.inference.serving.infra.models import AIStudioResultResponse
    from paddlex.inference.serving.schemas.ocr import InferResult

    def pruned(**settings):
        body = {"file": base64.b64encode(images[1]).decode(), "fileType": 1, **settings}
        answer = httpx.post(f"{served.url}/ocr", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        return AIStudioResultResponse[InferResult].model_validate(answer.json()).result.ocrResults[0].prunedResult

    default, off = pruned(), pruned(useDocOrientationClassify=False, useDocUnwarping=False)
    flat_off = pruned(useDocOrientationClassify=True, useDocUnwarping=False)
    assert default["model_settings"]["use_doc_preprocessor"] is True
    assert default["doc_preprocessor_res"] == {"model_settings": {"use_doc_orientation_classify": True,
                                                                  "use_doc_unwarping": True}, "angle": 90}
    # As PaddleX's, less what PaddleX serving prunes (input_path, page_index).
    assert default["doc_preprocessor_res"] == {key: value for key, value in reference[1]["doc_preprocessor_res"].items()
                                               if key not in ("input_path", "page_index")}
    assert differences(default, reference[1]) == []
    assert flat_off["doc_preprocessor_res"] == {"model_settings": {"use_doc_orientation_classify": True,
                                                                   "use_doc_unwarping": False}, "angle": 90}
    assert off["model_settings"]["use_doc_preprocessor"] is False and "doc_preprocessor_res" not in off
    # PaddleX's rule, copied: one switch sent, false, turns the whole preprocessor off.
    assert pruned(useDocUnwarping=False)["model_settings"]["use_doc_preprocessor"] is False


def test_the_models_are_the_repositorys(served):
    for name, shape in (("ocr.DocOrientationClassify", [3, 224, 224]), ("ocr.DocUnwarping", [3, -1, -1])):
        config = httpx.get(f"{served.url}/v2/models/{name}/config", timeout=30).json()
        assert config["max_batch_size"] == 1  # PaddleX's batch size of a module whose settings leave it out
        assert config["input"][0]["dims"] == shape
