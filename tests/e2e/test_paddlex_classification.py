"""PaddleX's image classification pipeline, served from its file with no code, against PaddleX itself.

The file is PaddleX's image_classification.yaml with its model a page-orientation classifier
(tests/support/image_classification_pipeline.yaml; the stand-in tests/support/standin_models.py builds,
since no image classifier can be downloaded here). The images are the OCR tests' pages turned each way.
PaddleX's own predictor on the same images is the reference (its pipeline is that predictor with the
file's topk, and needs ``paddlex[cv]``, which the reference venv does not install): the same classes,
in the same order, and scores within 0.01. PaddleX serving's ``/image-classification`` answers with its
own schema.
"""

from __future__ import annotations

import base64
import shutil

import cv2
import httpx
import numpy as np
import pytest
from loadtest import pages
from support import standin_models, paddlex_reference

PIPELINE = paddlex_reference.PIPELINE.with_name("image_classification_pipeline.yaml")
#: Pages the classifier reads surely, and each one's turn (its class's name).
PAGES = {0: "0", 2: "90", 4: "180", 5: "270", 9: "90", 11: "180", 12: "270", 17: "0"}


@pytest.fixture(scope="module")
def images():
    return [standin_models.turned(pages.page(index).data, int(turn)) for index, turn in PAGES.items()]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    standin_models.copy_to(standin_models.ORIENTATION, root / "classify" / standin_models.ORIENTATION)
    shutil.copyfile(PIPELINE, root / "classify" / "pipeline.yaml")
    return root


@pytest.fixture(scope="module")
def reference(images):
    """PaddleX's answers: each image with no topk (the file's 5), then the first two with topk 2. PaddleX
    3.7.2 answers an image's ``class_ids`` as its batch's array (one row here: one image a call), which
    its predictor does not split (it splits lists); each image's are that row."""
    asked = [(image, None) for image in images] + [(image, 2) for image in images[:2]]
    found = paddlex_reference.reference_classification(
        standin_models.ORIENTATION, standin_models.export(standin_models.ORIENTATION), asked, topk=5)
    for result in found:
        assert np.shape(result["class_ids"])[0] == 1  # the batch's, of one image
        result["class_ids"] = result["class_ids"][0]
    return found


@pytest.fixture(scope="module")
def served(repository):
    with paddlex_reference.served(repository, "classify") as proc:
        yield proc


def over_v2(url: str, data: bytes, parameters: dict | None = None) -> dict:
    return paddlex_reference.as_lists(paddlex_reference.over_v2(url, "classify", data, parameters),
                                      ("class_ids", "scores", "label_names"))


_same = paddlex_reference.same_classes


def test_the_classes_are_paddlexs(served, images, reference):
    url = served.url[len("http://"):]
    answers = paddlex_reference.together(served, over_v2, images)  # batches join across requests
    wrong = {i: (a, r) for i, (a, r) in enumerate(zip(answers, reference)) if not _same(a, r)}
    assert wrong == {}, wrong
    assert [a["label_names"][0] for a in answers] == list(PAGES.values())  # each page's turn, best first
    assert all(len(a["class_ids"]) == 4 for a in answers)  # the file's topk 5, of 4 classes
    # A request's topk, as PaddleX's predict takes it.
    for image, expected in zip(images[:2], reference[len(images):]):
        assert _same(over_v2(url, image, {"topk": 2}), expected) and len(expected["class_ids"]) == 2


def test_paddlex_servings_api_answers_with_its_schema(served, images, reference):
    from paddlex.inference.serving.infra.models import AIStudioResultResponse
    from paddlex.inference.serving.schemas.image_classification import InferResult

    for body, expected in (({}, reference[0]), ({"topk": 2}, reference[len(images)])):
        answer = httpx.post(f"{served.url}/image-classification",
                            json={"image": base64.b64encode(images[0]).decode(), **body}, timeout=120)
        assert answer.status_code == 200, answer.text
        result = AIStudioResultResponse[InferResult].model_validate(answer.json()).result
        found = {"class_ids": [c.id for c in result.categories], "label_names": [c.name for c in result.categories],
                 "scores": [c.score for c in result.categories]}
        assert _same(found, expected), (found, expected)


@pytest.mark.parametrize("body, says", [
    ({"image": base64.b64encode(b"x").decode(), "topk": 0}, '"loc": "body.topk"'),  # PaddleX's own check
    ({"image": base64.b64encode(b"x").decode(), "topk": "all"}, '"loc": "body.topk"'),
    ({"image": "http://127.0.0.1:9/cat.png"}, "image: URLs are not fetched"),
    ({"image": "***"}, "image is not base64"),
    ({"image": base64.b64encode(b"not an image").decode()}, "not an image OpenCV can decode"),
    # A strip of a few hundred bytes that the classifier's resize would make 1.3 billion pixels of.
    ({"image": base64.b64encode(cv2.imencode(".png", np.full((1, 20_000, 3), 255, np.uint8))[1].tobytes()).decode()},
     "20000x1 px: PaddleX's resizes would make a side of it hundreds of times longer; send an image whose sides are "
     "within 1:256"),
])
def test_a_bad_request_is_a_422_in_paddlexs_error_shape(served, body, says):
    answer = httpx.post(f"{served.url}/image-classification", json=body, timeout=30)
    assert answer.status_code == 422, answer.text
    found = answer.json()
    assert set(found) == {"logId", "errorCode", "errorMsg"} and says in found["errorMsg"], found


def test_a_bad_topk_over_v2_is_a_400_and_ocr_is_not_served(served, images):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as refused:
        over_v2(served.url[len("http://"):], images[0], {"topk": "all"})
    assert refused.value.status() == "400" and "parameter topk" in refused.value.message()
    answer = httpx.post(f"{served.url}/ocr", json={"file": base64.b64encode(images[0]).decode(), "fileType": 1},
                        timeout=30)
    assert answer.status_code == 404 and "no PaddleX OCR pipeline is served" in answer.json()["errorMsg"]


def test_the_classifier_is_a_model_of_the_repository_batched_as_the_file_says(served):
    config = httpx.get(f"{served.url}/v2/models/classify.ImageClassification/config", timeout=30).json()
    assert config["max_batch_size"] == 4
    assert httpx.get(f"{served.url}/v2/models/classify", timeout=30).json()["outputs"] == [
        {"name": "result", "datatype": "BYTES", "shape": [1]}, {"name": "class_ids", "datatype": "INT32", "shape": [-1]}, {"name": "scores", "datatype": "FP32", "shape": [-1]},
        {"name": "label_names", "datatype": "BYTES", "shape": [-1]}]
