"""PaddleX's small object detection pipeline, served from its file with no code of its own (a row of
``paddlex_pipeline.FIELDS``: its boxes, as object detection's), against PaddleX itself.

The file is PaddleX's small_object_detection.yaml with its model the detector stand-in under
``PP-YOLOE_plus_SOD-S``'s name (tests/support/small_object_detection_pipeline.yaml; standin_models.py). The
images are test_paddlex_detection.py's: red, green and blue rectangles on white pages of several sizes, and a
white one. PaddleX's own predictor with the file's settings is the reference: the same boxes, classes and
order, coordinates within 2 px and scores within 0.01, over v2 (4 requests in flight, sharing the detector's
batches) and PaddleX serving's ``/small-object-detection``. The control: a request's threshold no score passes
leaves no box.
"""

from __future__ import annotations

import base64
import concurrent.futures

import httpx
import pytest
from support import paddlex_reference, standin_models

PIPELINE = paddlex_reference.PIPELINE.with_name("small_object_detection_pipeline.yaml")
MODEL = standin_models.SMALL_DETECTION
IMAGES = standin_models.SHAPES
KEYS = ("class_ids", "scores", "label_names", "coordinates")


@pytest.fixture(scope="module")
def images():
    return standin_models.shapes_images()


@pytest.fixture(scope="module")
def reference(images):
    """PaddleX's answers: each image with the file's threshold 0.5, then the first with a request's 1.0."""
    asked = [(data, {}) for data, _ in images] + [(images[0][0], {"threshold": 1.0})]
    found = paddlex_reference.reference_model(MODEL, standin_models.export(MODEL), asked, {"threshold": 0.5},
                                              ("boxes",))
    return [paddlex_reference.box_fields(result["boxes"]) for result in found]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with paddlex_reference.served_standin(tmp_path_factory.mktemp("repository"), "small", MODEL, PIPELINE) as proc:
        yield proc


def test_the_boxes_are_paddlexs(served, images, reference):
    url = served.url[len("http://"):]

    def over_v2(job) -> dict:
        data, parameters = job
        return paddlex_reference.as_lists(paddlex_reference.over_v2(url, "small", data, parameters), KEYS)

    asked = [(data, None) for data, _ in images] + [(images[0][0], {"threshold": 1.0})]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # the detector's batches join requests
        answers = list(pool.map(over_v2, asked))
    wrong = {i: (a, r) for i, (a, r) in enumerate(zip(answers, reference)) if paddlex_reference.box_differences(a, r)}
    assert wrong == {}, wrong
    # The stand-in finds what was drawn (each rectangle's colour, in some order); the controls find none.
    assert [sorted(a["label_names"]) for a in answers[:len(IMAGES)]] == \
        [sorted(name for name, _ in drawn) for _, drawn in images[:len(IMAGES)]]
    assert answers[len(IMAGES)]["label_names"] == [] and answers[-1]["label_names"] == []


def test_paddlex_servings_api_answers_with_its_schema(served, images, reference):
    from paddlex.inference.serving.infra.models import AIStudioResultResponse
    from paddlex.inference.serving.schemas.small_object_detection import InferResult

    answer = httpx.post(f"{served.url}/small-object-detection",
                        json={"image": base64.b64encode(images[0][0]).decode()}, timeout=120)
    assert answer.status_code == 200, answer.text
    found = AIStudioResultResponse[InferResult].model_validate(answer.json()).result.detectedObjects
    assert paddlex_reference.box_differences(
        {"class_ids": [o.categoryId for o in found], "label_names": [o.categoryName for o in found],
         "coordinates": [o.bbox for o in found], "scores": [o.score for o in found]}, reference[0]) == []
    refused = httpx.post(f"{served.url}/small-object-detection", json={"image": "***"}, timeout=30)
    assert refused.status_code == 422 and "image is not base64" in refused.json()["errorMsg"]
