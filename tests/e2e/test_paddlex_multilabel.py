"""PaddleX's multi-label image classification pipeline, served from its file with no code of its own (a row of
``paddlex_pipeline.FIELDS``: its classes), against PaddleX itself.

The file is PaddleX's image_multilabel_classification.yaml with its model the ``PP-LCNet_x1_0_ML`` stand-in
(tests/support/image_multilabel_classification_pipeline.yaml; standin_models.py: which of red, green and blue an
image holds). The images are white, with a rectangle of each of one to three of the colours. PaddleX's own
predictor on the same images is the reference (what its pipeline runs, with the file's settings): the same
classes in the same order, scores within 0.01, over v2 and PaddleX serving's
``/multilabel-image-classification``.
The controls: a threshold no score passes drops the labels (PaddleX's per-class form, whose first entry
PaddleX 3.7.2 applies to every class of a lone image), and a white image holds none.
"""

from __future__ import annotations

import base64
import json

import cv2
import httpx
import numpy as np
import pytest
from support import paddlex_reference, standin_models

PIPELINE = paddlex_reference.PIPELINE.with_name("image_multilabel_classification_pipeline.yaml")
COLOURS = tuple(standin_models.COLOURS)
KEYS = ("class_ids", "scores", "label_names")
#: The threshold each image is also asked with: PaddleX's list form, a class each, red (class 0) at one no
#: score passes (scores are at most 1); PaddleX serving's request gives it in its mapping form too. PaddleX
#: 3.7.2's MultiLabelThreshOutput zips the list with the batch's rows, not its classes, so the first entry is
#: the threshold of an image alone, of every class: it drops every label, as the service must too.
PER_CLASS = [1.0, 0.5, 0.5]


def _image(seed: int) -> tuple[bytes, list[str]]:
    """A white image with a rectangle of each of one to three colours, a band each; its PNG and the colours
    drawn."""
    rng = np.random.default_rng(seed)
    width, height = 240 + 40 * seed, 300 - 10 * seed
    drawn = [name for name in COLOURS if rng.random() < 0.6] or [COLOURS[seed % 3]]
    image = np.full((height, width, 3), 255, np.uint8)
    for band, name in enumerate(drawn):
        top = int(height * (0.25 + 0.17 * band))
        left = int(width * rng.uniform(0.3, 0.45))
        image[top:top + int(height * 0.12), left:left + int(width * 0.25)] = standin_models.COLOURS[name]
    return cv2.imencode(".png", image)[1].tobytes(), drawn


@pytest.fixture(scope="module")
def images():
    return [_image(seed) for seed in range(8)]


@pytest.fixture(scope="module")
def white():
    return cv2.imencode(".png", np.full((200, 200, 3), 255, np.uint8))[1].tobytes()


@pytest.fixture(scope="module")
def reference(images, white):
    """PaddleX's answers: each image with the file's threshold, then with ``PER_CLASS``, then the white image."""
    asked = [(data, {}) for data, _ in images] + [(data, {"threshold": PER_CLASS}) for data, _ in images]
    model = standin_models.MULTILABEL
    return paddlex_reference.reference_model(model, standin_models.export(model), asked + [(white, {})], {}, KEYS)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with paddlex_reference.served_standin(tmp_path_factory.mktemp("repository"), "labels", standin_models.MULTILABEL,
                                          PIPELINE) as proc:
        yield proc


def _over_v2(url: str, data: bytes, parameters: dict | None = None) -> dict:
    return paddlex_reference.as_lists(paddlex_reference.over_v2(url, "labels", data, parameters), KEYS)


def test_the_labels_are_paddlexs_and_a_threshold_reaches_it(served, images, white, reference):
    per_class = {"threshold": json.dumps(PER_CLASS)}
    asked = [(data, None) for data, _ in images] + [(data, per_class) for data, _ in images]
    # batches join across requests
    answers = paddlex_reference.together(served, lambda target, job: _over_v2(target, *job), asked + [(white, None)])
    wrong = {i: (a, r) for i, (a, r) in enumerate(zip(answers, reference)) if not paddlex_reference.same_classes(a, r)}
    assert wrong == {}, wrong
    count = len(images)
    # The stand-in reads the images: each colour drawn, and no other; the controls hold none.
    assert [sorted(a["label_names"]) for a in answers[:count]] == [sorted(drawn) for _, drawn in images]
    assert [a["label_names"] for a in answers[count:]] == [[]] * (count + 1)


def test_paddlex_servings_api_answers_with_its_schema(served, images, reference):
    from paddlex.inference.serving.infra.models import AIStudioResultResponse
    from paddlex.inference.serving.schemas.image_multilabel_classification import InferResult

    mapping = {"threshold": {"default": 0.5, 0: 1.0}}  # PER_CLASS in PaddleX serving's mapping form
    for extra, expected in (({}, reference[0]), (mapping, reference[len(images)])):
        body = {"image": base64.b64encode(images[0][0]).decode(), **extra}
        answer = httpx.post(f"{served.url}/multilabel-image-classification", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        result = AIStudioResultResponse[InferResult].model_validate(answer.json()).result
        found = {"class_ids": [c.id for c in result.categories],
                 "label_names": [c.name for c in result.categories], "scores": [c.score for c in result.categories]}
        assert paddlex_reference.same_classes(found, expected), (found, expected)
    refused = httpx.post(f"{served.url}/multilabel-image-classification",
                         json={"image": "http://127.0.0.1:9/cat.png"}, timeout=30)
    assert refused.status_code == 422 and "URLs are not fetched" in refused.json()["errorMsg"]


def test_the_classifier_is_a_model_of_the_repository_batched_as_the_file_says(served):
    config = httpx.get(f"{served.url}/v2/models/labels.ImageMultiLabelClassification/config", timeout=30).json()
    assert config["max_batch_size"] == 4
    assert [o["name"] for o in httpx.get(f"{served.url}/v2/models/labels", timeout=30).json()["outputs"]] == \
        ["result", *KEYS]
