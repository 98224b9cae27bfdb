"""PaddleX's OCR pipeline with text-line orientation on, served from its file with no code, against
PaddleX itself.

The file is PaddleX's OCR.yaml with ``use_textline_orientation: True`` and its ``TextLineOrientation``
SubModule (tests/support/ocr_textline_pipeline.yaml); the classifier is a PP-LCNet_x0_25_textline_ori
export trained here (tests/support/textline_model.py: PaddleOCR's cannot be downloaded on this
machine). The pages are the OCR tests' with every third line drawn upside down (loadtest/pages.py).
PaddleX's own pipeline on the same pages is the reference: the same texts, angles, polygons within 2 px
and scores within 0.01. The control: the same pages with the switch off per request read the upside-down
lines wrong, and the angles are -1.

Both run the classifier with ``batch_size: 1``. PaddleX 3.7.2 gives every crop of a batch the first crop's
class: its classifier's ``class_ids`` is one array for the whole batch, which its predictor does not split
(it splits lists), and the OCR pipeline takes each result's first id. One crop a batch is where PaddleX's
answer is each crop's own class, the answer its pipeline means; the service runs PaddleX's own pipeline
code, so with a larger batch size it answers as PaddleX does, quirk and all, and
``test_paddlex_with_batches_gives_each_crop_its_batchs_first_class`` pins that quirk.
"""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from loadtest import pages
from support import paddlex_reference

differences = paddlex_reference.differences

FIELDS = (*paddlex_reference.FIELDS, "textline_orientation_angles")
TEMPLATE = paddlex_reference.TEXTLINE_PIPELINE
PAGES = 8


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """The file as it is, its model_dirs relative to it, the three exports beside it."""
    root = tmp_path_factory.mktemp("repository")
    directory = root / "ocr"
    directory.mkdir()
    paddlex_reference.place_textline_models(directory)
    text = TEMPLATE.read_text()
    assert text.count("    batch_size: 6\n  TextRecognition") == 1
    (directory / "pipeline.yaml").write_text(text.replace("    batch_size: 6\n  TextRecognition",
                                                          "    batch_size: 1\n  TextRecognition"))
    return root


@pytest.fixture(scope="module")
def page_set():
    return pages.pages(PAGES, upside_down=3)


def _reference(tmp_path_factory, page_set, batch_size: int) -> list[dict]:
    """PaddleX's own pipeline on the pages, the file's classifier batch size set to ``batch_size``."""
    yaml = paddlex_reference.textline_pipeline_file(tmp_path_factory.mktemp("reference"), batch_size)
    return paddlex_reference.reference_ocr(yaml, [p.data for p in page_set], fields=FIELDS)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, page_set):
    return _reference(tmp_path_factory, page_set, 1)


@pytest.fixture(scope="module")
def served(repository):
    with paddlex_reference.served(repository, "ocr") as proc:
        yield proc


def over_v2(url: str, data: bytes, parameters: dict | None = None) -> dict:
    result = paddlex_reference.over_v2(url, "ocr", data, parameters)
    answer = {key: result.as_numpy(key) for key in FIELDS}
    answer["rec_texts"] = [text.decode() for text in answer["rec_texts"]]
    answer["textline_orientation_angles"] = answer["textline_orientation_angles"].tolist()
    return answer


def _turned_read(answers, page_set) -> float:
    """The share of upside-down lines whose text is among their page's texts."""
    turned = [(page.lines[i], answer["rec_texts"]) for page, answer in zip(page_set, answers) for i in page.turned]
    return sum(text in texts for text, texts in turned) / len(turned)


# PaddleX's own run is this test's set-up, and on a fresh machine the classifier's training (about 7 minutes).
@pytest.mark.timeout(1800)
def test_textline_orientation_answers_as_paddlex(served, page_set, reference):
    url = served.url[len("http://"):]
    # the classifier's batches join across pages
    answers = paddlex_reference.together(served, over_v2, [p.data for p in page_set])
    problems = {i: d for i, (a, r) in enumerate(zip(answers, reference)) if (d := differences(a, r))}
    assert problems == {}, problems
    assert [a["textline_orientation_angles"] for a in answers] == [r["textline_orientation_angles"]
                                                                   for r in reference]
    angles = [angle for a in answers for angle in a["textline_orientation_angles"]]
    assert set(angles) == {0, 1}, angles  # lines of both kinds, each classified
    assert _turned_read(answers, page_set) >= 0.8
    # The control: the switch off for these requests reads the upside-down lines as drawn, wrong; no angles.
    off = [over_v2(url, p.data, {"use_textline_orientation": False}) for p in page_set]
    assert _turned_read(off, page_set) <= 0.2
    assert all(set(a["textline_orientation_angles"]) <= {-1} for a in off)
    assert [a["dt_polys"].tolist() for a in off] == [r["dt_polys"] for r in reference]  # only the reading differs


def test_paddlex_servings_api_turns_it_on_and_off_per_request(served, page_set, reference):
    from paddlex.inference.serving.infra.models import AIStudioResultResponse
    from paddlex.inference.serving.schemas.ocr import InferResult

    def pruned(**settings):
        body = {"file": base64.b64encode(page_set[0].data).decode(), "fileType": 1, **settings}
        answer = httpx.post(f"{served.url}/ocr", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        return AIStudioResultResponse[InferResult].model_validate(answer.json()).result.ocrResults[0].prunedResult

    default, asked, off = pruned(), pruned(useTextlineOrientation=True), pruned(useTextlineOrientation=False)
    for answer in (default, asked):
        assert answer["model_settings"]["use_textline_orientation"] is True
        assert differences(answer, reference[0]) == []
        assert answer["textline_orientation_angles"] == reference[0]["textline_orientation_angles"]
    assert off["model_settings"]["use_textline_orientation"] is False
    assert set(off["textline_orientation_angles"]) == {-1} and off["rec_texts"] != default["rec_texts"]


def test_a_switch_that_is_not_true_or_false_is_a_400_naming_it(served, page_set):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as refused:
        over_v2(served.url[len("http://"):], page_set[0].data, {"use_textline_orientation": "yes"})
    assert refused.value.status() == "400"
    assert "use_textline_orientation" in refused.value.message() and "true or false" in refused.value.message()


def test_the_classifier_is_a_model_of_the_repository_batched_as_the_file_says(served):
    config = httpx.get(f"{served.url}/v2/models/ocr.TextLineOrientation/config", timeout=30).json()
    assert config["max_batch_size"] == 1
    assert [o["name"] for o in config["output"]] == ["fetch_name_0"]
    # What runs it is what backend auto measured fastest among those that agree with Paddle Inference.
    choice = json.loads(config["parameters"]["backend_choice"]["string_value"])["cpu"]
    assert httpx.get(f"{served.url}/v2/models/ocr.TextLineOrientation", timeout=30).json()["platform"] == {
        "inference": "paddle_inference", "onnxruntime": "onnxruntime_onnx", "openvino": "openvino"}[choice["serves"]]


@pytest.mark.timeout(900)
def test_paddlex_with_batches_gives_each_crop_its_batchs_first_class(tmp_path_factory, page_set, reference):
    batched = _reference(tmp_path_factory, page_set[:4], 6)  # (4 pages: one PaddleX run less long)
    for ours, theirs in zip(reference, batched):
        angles = ours["textline_orientation_angles"] or []
        firsts = [angles[i - i % 6] for i in range(len(angles))]
        assert (theirs["textline_orientation_angles"] or []) == firsts
    # Not a coincidence of the pages: their lines' classes differ within a batch.
    assert any(len(set(r["textline_orientation_angles"][:6])) > 1 for r in reference[:4])
